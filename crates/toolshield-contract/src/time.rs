//! The clock of the layers, and wall-clock stamps as RFC 3339 text.
//!
//! **One clock read per call on entry.** Every toolshield layer reads the monotonic clock
//! through [`now`]. The first layer to see a call stamps its entry on the request's
//! [`CallState`](crate::CallState) ([`CallState::enter`](crate::CallState::enter)); every
//! layer after it that needs the call's start (provenance, the call deadline) reads the
//! stamp instead of the clock. On exit the provenance layer reads the clock once and
//! records the call's duration on the response
//! ([`ShieldResponse::call_duration`](crate::ShieldResponse::call_duration)), so the metrics
//! layer outside it, timing the call from the same entry stamp, reads no clock of its own. Wall-clock times are
//! derived from a monotonic reading with [`wall_clock`] (one base per process, re-read at
//! most once a second), not read again.
//!
//! With the `clock-count` feature, `reads` counts the reads [`now`] made on the calling
//! thread, so a test can assert how many reads a call costs.
//!
//! [`Rfc3339`] shows a [`SystemTime`] as RFC 3339 text (`2026-11-23T09:15:02.123Z`)
//! without a date crate: the breaker's events and status serialize their times this way.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

#[cfg(feature = "clock-count")]
std::thread_local! {
    static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The monotonic clock, as tokio sees it (so a paused test clock applies): what every
/// toolshield layer reads.
#[inline]
pub fn now() -> Instant {
    #[cfg(feature = "clock-count")]
    READS.with(|r| r.set(r.get() + 1));
    Instant::now()
}

/// The entry stamp of the call `req` carries ([`CallState::enter`](crate::CallState::enter)):
/// stamped now if no layer did. A request whose state does not exist yet (an
/// `http::Request` keeps it in its extensions, created on first write) is not given one
/// here, which would allocate: the clock is read and nothing is stamped.
pub fn enter<R: crate::ShieldRequest + ?Sized>(req: &mut R) -> Instant {
    if req.call_state().is_none() {
        return now();
    }
    req.call_state_mut()
        .map_or_else(now, crate::CallState::enter)
}

/// How many times [`now`] was called on this thread (feature `clock-count`).
#[cfg(feature = "clock-count")]
#[must_use]
pub fn reads() -> u64 {
    READS.with(std::cell::Cell::get)
}

/// The process's monotonic origin for [`wall_clock`].
static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
/// Wall-clock nanoseconds since the Unix epoch minus monotonic nanoseconds since
/// [`ORIGIN`], as of the last re-base.
static OFFSET_NS: AtomicI64 = AtomicI64::new(0);
/// Monotonic nanoseconds since [`ORIGIN`] of the last re-base, plus one (0: never).
static REBASED_NS: AtomicU64 = AtomicU64::new(0);
/// How long a base serves before the wall clock is read again: the derived time follows
/// the system clock (NTP slews, a clock set by hand) within this delay.
const REBASE_EVERY_NS: u64 = 1_000_000_000;

/// Signed nanoseconds from `origin` to `at`, saturating.
fn since(origin: std::time::Instant, at: std::time::Instant) -> i64 {
    let (d, sign) = match at.checked_duration_since(origin) {
        Some(d) => (d, 1),
        None => (origin.saturating_duration_since(at), -1),
    };
    sign * i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// The wall-clock time of the monotonic reading `at`, derived from one base per process
/// (re-read at most once a second) instead of a second clock read.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use toolshield_contract::time::{now, wall_clock};
///
/// let derived = wall_clock(now());
/// let read = SystemTime::now();
/// let apart = read.duration_since(derived).unwrap_or_else(|e| e.duration());
/// assert!(apart < Duration::from_secs(1));
/// ```
#[must_use]
pub fn wall_clock(at: Instant) -> SystemTime {
    match u64::try_from(unix_nanos(at)) {
        Ok(ns) => UNIX_EPOCH + Duration::from_nanos(ns),
        Err(_) => UNIX_EPOCH,
    }
}

/// The wall-clock time of the monotonic reading `at` as nanoseconds since the Unix
/// epoch (negative before it), derived as [`wall_clock`] derives it: what a caller that
/// builds its own calendar time needs, without a `SystemTime` in between.
#[must_use]
pub fn unix_nanos(at: Instant) -> i64 {
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    let mono = since(origin, at.into_std());
    let rebased = REBASED_NS.load(Ordering::Acquire);
    let stale = rebased == 0
        || u64::try_from(mono).is_ok_and(|m| m.saturating_sub(rebased - 1) >= REBASE_EVERY_NS);
    let offset = if stale {
        // The wall clock is read between two monotonic readings, so the offset it gives
        // is known to lie in `[wall - after, wall - before]`; how wide that is depends on
        // how long the thread waited between the reads.
        let before = since(origin, std::time::Instant::now());
        let wall_now = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
        };
        let after = since(origin, std::time::Instant::now());
        let old = (rebased != 0).then(|| OFFSET_NS.load(Ordering::Acquire));
        let offset = rebased_offset(old, before, wall_now, after);
        match old {
            // Another thread may have moved the offset on meanwhile: never back.
            Some(old) if offset >= old => {
                OFFSET_NS.fetch_max(offset, Ordering::AcqRel);
            }
            _ => OFFSET_NS.store(offset, Ordering::Release),
        }
        REBASED_NS.store(
            u64::try_from(after).unwrap_or(0).saturating_add(1),
            Ordering::Release,
        );
        OFFSET_NS.load(Ordering::Acquire)
    } else {
        OFFSET_NS.load(Ordering::Relaxed)
    };
    mono.saturating_add(offset)
}

/// The offset (wall-clock minus monotonic nanoseconds) a re-base sets, from the one in
/// use (`None` before the first) and a wall-clock reading `wall` taken between the
/// monotonic readings `before` and `after`.
///
/// The reading proves the offset lies in `[wall - after, wall - before]`. The offset in use
/// is kept while it lies in that range, or moved up to its low end: sampling noise (the
/// thread preempted between the reads) never moves derived times back, so a stamp taken
/// later never reads earlier than one taken before it. Only a reading that proves the
/// system clock was set back (the whole range below the offset in use) moves it down.
fn rebased_offset(old: Option<i64>, before: i64, wall: i64, after: i64) -> i64 {
    let low = wall.saturating_sub(after);
    let high = wall.saturating_sub(before);
    match old {
        Some(old) if high >= old => old.max(low),
        _ => low,
    }
}

/// A [`SystemTime`] shown as RFC 3339 in UTC with milliseconds; times before 1970 show as
/// the epoch.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use toolshield_contract::time::Rfc3339;
///
/// let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
/// assert_eq!(Rfc3339(t).to_string(), "2023-11-14T22:13:20.123Z");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339(pub SystemTime);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = self.0.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        let secs = since.as_secs();
        let days = secs / 86_400;
        let rem = secs % 86_400;
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
            rem / 3600,
            rem / 60 % 60,
            rem % 60,
            since.subsec_millis()
        )
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Serializes a [`SystemTime`] as RFC 3339 text: `#[serde(serialize_with = "toolshield_contract::time::serialize")]`.
#[cfg(feature = "serde")]
pub fn serialize<S: serde::Serializer>(
    time: &SystemTime,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&Rfc3339(*time))
}

/// The same for `Option<SystemTime>` (`None` is `null`).
#[cfg(feature = "serde")]
pub fn serialize_option<S: serde::Serializer>(
    time: &Option<SystemTime>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match time {
        Some(t) => serializer.collect_str(&Rfc3339(*t)),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_wall_clock_follows_the_monotonic_clock() {
        let a = now();
        let wall_a = wall_clock(a);
        let b = a + Duration::from_millis(250);
        let wall_b = wall_clock(b);
        let step = wall_b.duration_since(wall_a).expect("later");
        assert!(
            step.abs_diff(Duration::from_millis(250)) < Duration::from_millis(5),
            "{step:?}"
        );
        let read = SystemTime::now();
        let apart = read.duration_since(wall_a).unwrap_or_else(|e| e.duration());
        assert!(apart < Duration::from_secs(1), "{apart:?}");
    }

    #[test]
    fn a_rebase_with_a_noisy_reading_never_moves_derived_times_back() {
        let old = 1_000_000;
        // The offset in use lies in the reading's range: kept, however the thread was
        // delayed between the reads (a delay of 3 ms here: range [997_000, 1_000_000+]).
        assert_eq!(
            rebased_offset(Some(old), 5_000_000, 6_000_000, 5_003_000),
            old
        );
        assert_eq!(
            rebased_offset(Some(old), 5_000_000, 6_000_100, 5_000_050),
            old + 50
        );
        // A whole range above: the system clock moved on; the offset follows to its
        // low end, never past what the reading proves.
        assert_eq!(
            rebased_offset(Some(old), 5_000_000, 6_500_000, 5_000_010),
            1_499_990
        );
        // A whole range below: the system clock was set back; followed.
        assert_eq!(
            rebased_offset(Some(old), 5_000_000, 5_400_000, 5_000_010),
            399_990
        );
        // The first base takes the low end.
        assert_eq!(
            rebased_offset(None, 5_000_000, 6_000_000, 5_000_010),
            999_990
        );
    }

    #[test]
    fn derived_times_never_go_back_across_rebases() {
        // Many rebases on several threads at once, each taking its readings as the
        // scheduler lets it: a stamp of a later reading never reads earlier.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    let mut last = i64::MIN;
                    for _ in 0..200_000 {
                        // A reading 2 s on from the last base: a re-base on every call.
                        let t = unix_nanos(Instant::now() + Duration::from_secs(2));
                        assert!(t >= last, "went back by {} ns", last - t);
                        last = t;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no thread went back");
        }
    }

    #[test]
    fn known_dates() {
        let at = |secs: u64| Rfc3339(UNIX_EPOCH + Duration::from_secs(secs)).to_string();
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59.000Z");
        assert_eq!(at(1_798_761_600), "2027-01-01T00:00:00.000Z");
    }
}
