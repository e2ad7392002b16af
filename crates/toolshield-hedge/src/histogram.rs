//! [`LatencyHistogram`]: a small, bounded, lock-free histogram of recent latencies, from
//! which the percentile delay is read.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Latencies recorded before a percentile is trusted; until then the delay is the
/// configured maximum.
pub const MIN_SAMPLES: u64 = 20;

/// Exact buckets for 0..16 µs, then 8 buckets per power of two up to 2^40 µs (12 days).
const LINEAR: usize = 16;
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
const MAX_EXP: u32 = 40;
const BUCKETS: usize = LINEAR + (MAX_EXP as usize - 3) * SUB;

/// The percentile is recomputed every this many records (a scan of the buckets), not on
/// every call.
const RECOMPUTE_EVERY: u64 = 16;
/// When the buckets hold more than this many samples they are halved: old latencies fade,
/// so the delay follows the tool's recent behaviour.
const WINDOW: u64 = 1024;

/// Not yet computed.
const UNSET: u64 = u64::MAX;

/// A histogram of latencies with log-linear buckets (within 12.5 % of the true value),
/// bounded in memory (~2.4 KB) whatever the traffic, updated with relaxed atomics.
///
/// Recording is one `fetch_add` (plus, every 16 records, a scan that recomputes the
/// percentile, skipped when another thread is already doing it). Reading the current
/// percentile is one atomic load. Older samples are halved away once more than 1,024 are
/// held, so the percentile follows recent latencies.
///
/// ```
/// use std::time::Duration;
/// use toolshield_hedge::LatencyHistogram;
///
/// let h = LatencyHistogram::new(90.0);
/// for ms in 1..=100 {
///     h.record(Duration::from_millis(ms));
/// }
/// let p90 = h.current().unwrap();
/// assert!(p90 >= Duration::from_millis(90) && p90 <= Duration::from_millis(102), "{p90:?}");
/// ```
pub struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    /// Records since creation (drives the recompute cadence).
    records: AtomicU64,
    /// Samples currently held in the buckets (approximately, under concurrent records).
    held: AtomicU64,
    /// The last computed percentile, in microseconds, or `UNSET`.
    current_us: AtomicU64,
    computing: AtomicBool,
    percentile: f64,
}

impl LatencyHistogram {
    /// An empty histogram that tracks the `percentile`-th percentile (clamped to 0..=100).
    #[must_use]
    pub fn new(percentile: f64) -> Self {
        let percentile = if percentile.is_finite() {
            percentile.clamp(0.0, 100.0)
        } else {
            100.0
        };
        LatencyHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            records: AtomicU64::new(0),
            held: AtomicU64::new(0),
            current_us: AtomicU64::new(UNSET),
            computing: AtomicBool::new(false),
            percentile,
        }
    }

    /// Records one latency.
    pub fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.held.fetch_add(1, Ordering::Relaxed);
        let n = self.records.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= MIN_SAMPLES && (n.is_multiple_of(RECOMPUTE_EVERY) || n == MIN_SAMPLES) {
            self.recompute();
        }
    }

    /// The tracked percentile of recent latencies, once at least [`MIN_SAMPLES`] were
    /// recorded. It is the upper bound of the bucket it falls in, so a little above the
    /// exact value (a hedge sent slightly late rather than early).
    pub fn current(&self) -> Option<Duration> {
        match self.current_us.load(Ordering::Relaxed) {
            UNSET => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Samples currently held (after halving).
    pub fn len(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn recompute(&self) {
        if self
            .computing
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let decay = self.held.load(Ordering::Relaxed) > WINDOW;
        let mut counts = [0u64; BUCKETS];
        let mut total = 0u64;
        for (count, bucket) in counts.iter_mut().zip(self.buckets.iter()) {
            let mut c = bucket.load(Ordering::Relaxed);
            if decay && c > 0 {
                // Subtract what we read halved: records racing with us are kept.
                let half = c / 2 + c % 2;
                bucket.fetch_sub(half, Ordering::Relaxed);
                c -= half;
            }
            *count = c;
            total += c;
        }
        if decay {
            self.held.store(total, Ordering::Relaxed);
        }
        if total > 0 {
            // Rank of the percentile, at least 1.
            let rank = ((self.percentile / 100.0) * total as f64).ceil().max(1.0) as u64;
            let mut seen = 0u64;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    self.current_us.store(upper_bound(i), Ordering::Relaxed);
                    break;
                }
            }
        }
        self.computing.store(false, Ordering::Release);
    }
}

/// The bucket of a latency of `us` microseconds.
fn bucket_of(us: u64) -> usize {
    if us < LINEAR as u64 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros(); // >= 4
    if exp > MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = ((us >> (exp - SUB_BITS)) as usize) & (SUB - 1);
    LINEAR + (exp as usize - 4) * SUB + sub
}

/// The largest latency (µs) that falls in bucket `i`.
fn upper_bound(i: usize) -> u64 {
    if i < LINEAR {
        return i as u64;
    }
    let exp = (i - LINEAR) / SUB + 4;
    let sub = ((i - LINEAR) % SUB) as u64;
    let width = 1u64 << (exp as u32 - SUB_BITS);
    (1u64 << exp) + (sub + 1) * width - 1
}

impl fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("percentile", &self.percentile)
            .field("held", &self.len())
            .field("current", &self.current())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_their_values() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            15,
            16,
            17,
            31,
            32,
            100,
            1_000,
            65_535,
            1 << 30,
            (1 << 41) - 1,
        ] {
            let b = bucket_of(us);
            assert!(b >= last, "bucket of {us} went backwards");
            last = b;
            assert!(
                upper_bound(b) >= us,
                "{us} above its bucket's bound {}",
                upper_bound(b)
            );
            if b > 0 {
                assert!(upper_bound(b - 1) < us, "{us} belongs in an earlier bucket");
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn bucket_error_is_within_an_eighth() {
        for us in (16..2_000_000u64).step_by(997) {
            let ub = upper_bound(bucket_of(us));
            assert!((ub - us) as f64 <= us as f64 / 8.0 + 1.0, "{us} -> {ub}");
        }
    }

    #[test]
    fn no_percentile_before_min_samples() {
        let h = LatencyHistogram::new(50.0);
        for _ in 0..MIN_SAMPLES - 1 {
            h.record(Duration::from_millis(5));
        }
        assert_eq!(h.current(), None);
        h.record(Duration::from_millis(5));
        assert!(h.current().is_some());
    }

    #[test]
    fn old_samples_fade() {
        let h = LatencyHistogram::new(50.0);
        for _ in 0..2_000 {
            h.record(Duration::from_millis(100));
        }
        assert!(h.len() <= WINDOW + RECOMPUTE_EVERY, "held {}", h.len());
        for _ in 0..3_000 {
            h.record(Duration::from_millis(1));
        }
        let p50 = h.current().unwrap();
        assert!(p50 < Duration::from_millis(2), "median still {p50:?}");
    }
}
