//! [`RateLimit`] and the GCRA decision every store makes.

use std::time::Duration;

use tokio::time::Instant;
use toolshield_contract::config::MAX_DURATION;

/// A rate: `rate` calls per `period`, with bursts of up to `burst` calls at once.
///
/// Enforced with GCRA (the generic cell rate algorithm): each key keeps one time, its
/// theoretical arrival time (TAT). A call at `now` conforms when `TAT - now <= tolerance`
/// (`tolerance = (burst - 1) * interval`, `interval = period / rate` rounded up to the
/// nanosecond); it then moves the
/// TAT to `max(TAT, now) + interval`. A call that does not conform would conform after
/// `TAT - tolerance - now`: that is the exact wait, and the `retry_after` of a rejection.
///
/// ```
/// use std::time::Duration;
/// use toolshield_ratelimit::RateLimit;
///
/// let limit = RateLimit::new(10, Duration::from_secs(1), 5);
/// assert_eq!(limit.interval(), Duration::from_millis(100));
/// assert_eq!(limit.tolerance(), Duration::from_millis(400));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    rate: u32,
    period: Duration,
    burst: u32,
    interval: Duration,
    tolerance: Duration,
}

impl RateLimit {
    /// `rate` calls per `period`, bursts of `burst`. Zeros count as 1 (a zero period as
    /// one nanosecond), and `period` is clamped to
    /// [`MAX_DURATION`]; a configuration is stricter
    /// ([`RateLimitConfig::validate`](crate::RateLimitConfig::validate)).
    #[must_use]
    pub fn new(rate: u32, period: Duration, burst: u32) -> Self {
        let rate = rate.max(1);
        let burst = burst.max(1);
        let period = period.clamp(Duration::from_nanos(1), MAX_DURATION);
        // Rounded up to the nanosecond: `rate` intervals never add up to less than the
        // period, so no period-long window ever holds more calls than the rate allows.
        let nanos = period.as_nanos().div_ceil(u128::from(rate));
        let interval = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            .max(Duration::from_nanos(1));
        let tolerance = interval
            .checked_mul(burst - 1)
            .unwrap_or(MAX_DURATION)
            .min(MAX_DURATION);
        RateLimit {
            rate,
            period,
            burst,
            interval,
            tolerance,
        }
    }

    /// Calls per period.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The most calls admitted at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The steady spacing of calls: `period / rate`, rounded up to the nanosecond (so
    /// the rate is never exceeded, when the rate does not divide the period).
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How far ahead of the steady rate a key may run: `(burst - 1) * interval`.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// The GCRA decision for a call at `now` against `tat` (the key's stored time, if
    /// any), waiting at most `max_wait`: the decision and the new time to store (`None`:
    /// store nothing).
    #[must_use]
    pub fn decide(
        &self,
        tat: Option<Instant>,
        now: Instant,
        max_wait: Duration,
    ) -> (Decision, Option<Instant>) {
        let tat = tat.map_or(now, |t| t.max(now));
        let wait = (tat - now).saturating_sub(self.tolerance);
        if wait > max_wait {
            return (Decision::Reject { retry_after: wait }, None);
        }
        // `tat - now` is at most tolerance + max_wait, both bounded: no overflow.
        let next = tat.checked_add(self.interval).unwrap_or(tat);
        (
            Decision::Admit {
                wait,
                turn: Turn::At(next),
            },
            Some(next),
        )
    }
}

/// What a store decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted: the call may start after `wait` (zero: at once). Its place is reserved:
    /// later calls queue behind it.
    Admit {
        /// How long the call waits before it starts.
        wait: Duration,
        /// The store's mark of the reserved turn, given back to
        /// [`RateLimitStore::refund`](crate::RateLimitStore::refund) if the call is
        /// cancelled before it starts.
        turn: Turn,
    },
    /// Rejected: nothing was reserved; a call would conform after `retry_after`.
    Reject {
        /// The time until the next conforming call.
        retry_after: Duration,
    },
}

/// A store's mark of one reserved turn: the key's time right after the reservation.
///
/// A cancelled waiter gives its turn back only while it is still the last one reserved
/// (the key's time still equals its mark): a turn in the middle of the queue cannot be
/// reused by a single GCRA time without letting the calls behind it and a newcomer start
/// together, so it is kept, and the limit errs on the strict side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The key's time on this process's clock (an in-memory store).
    At(Instant),
    /// A remote store's own mark, such as the key's time in microseconds on the Redis
    /// server's clock.
    Mark(i64),
}
