//! The retry budget: a token bucket shared by every clone of a layer, so retries add at
//! most a fraction of the traffic (with a floor of a few retries per second).

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use tokio::time::Instant;

/// One token, in the bucket's fixed-point unit (millionths of a retry). Fractions such as
/// 0.2 or 0.125 are exact to one millionth, so a fraction never rounds up to "always".
const UNIT: i64 = 1_000_000;

/// A token bucket that limits retries to a fraction of calls.
///
/// - every call (first attempt) deposits `ratio` of a token;
/// - every retry withdraws one token; with less than one token the retry is refused;
/// - a floor of `min_per_sec` tokens per second is credited with time, so a service with
///   little traffic can still retry;
/// - the bucket holds at most `burst` tokens, so a long healthy period does not save up
///   a retry storm; it starts with one second of the floor.
///
/// Over any period of `t` seconds with `n` calls, retries stay below
/// `ratio × n + min_per_sec × t + burst`; under sustained failure they settle at
/// `ratio × call rate + min_per_sec`.
///
/// Lock-free: a deposit is one relaxed load and, when the bucket is not full, one
/// `fetch_add`; it reads no clock and allocates nothing. A withdrawal reads the clock
/// once (for the floor) and does a compare-and-swap. It uses tokio's clock, so tests with
/// a paused clock control it.
pub struct RetryBudget {
    balance: AtomicI64,
    deposit: i64,
    capacity: i64,
    per_sec: u64,
    start: Instant,
    /// Nanoseconds since `start` up to which the floor has been credited (the time of a
    /// fraction of a unit not yet credited stays after it).
    credited_ns: AtomicU64,
}

impl RetryBudget {
    /// A budget letting retries add `ratio` of the calls (0.2 = 20 %), plus `min_per_sec`
    /// retries per second, holding at most `burst` tokens.
    ///
    /// Out-of-range numbers are clamped (a negative or NaN ratio counts as 0, a burst of 0
    /// as 1); [`BudgetConfig::validate`](crate::BudgetConfig::validate) reports them.
    #[must_use]
    pub fn new(ratio: f64, min_per_sec: u32, burst: u32) -> Self {
        let ratio = if ratio.is_finite() && ratio > 0.0 {
            ratio.min(1000.0)
        } else {
            0.0
        };
        // `as` saturates; the value is at most 1e9.
        let deposit = (ratio * UNIT as f64).round() as i64;
        let capacity = i64::from(burst.max(1)) * UNIT;
        let initial = (i64::from(min_per_sec) * UNIT).min(capacity);
        RetryBudget {
            balance: AtomicI64::new(initial),
            deposit,
            capacity,
            per_sec: u64::from(min_per_sec),
            start: Instant::now(),
            credited_ns: AtomicU64::new(0),
        }
    }

    /// Records a call (a first attempt): deposits `ratio` of a token.
    #[inline]
    pub fn deposit(&self) {
        // Skip the write when the bucket is already full: the shared cache line stays
        // read-only on the success path of a healthy service.
        if self.balance.load(Ordering::Relaxed) < self.capacity {
            self.balance.fetch_add(self.deposit, Ordering::Relaxed);
        }
    }

    /// Asks for one retry: `true` (and a token is spent) if the budget allows it.
    pub fn try_withdraw(&self) -> bool {
        self.credit_floor();
        let mut current = self.balance.load(Ordering::Relaxed);
        loop {
            let capped = current.min(self.capacity);
            if capped < UNIT {
                return false;
            }
            match self.balance.compare_exchange_weak(
                current,
                capped - UNIT,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// Gives back a token withdrawn for a retry that never started (the call was dropped
    /// or cancelled while backing off). Never above the capacity.
    pub(crate) fn refund(&self) {
        let _ = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.min(self.capacity).saturating_add(UNIT).min(self.capacity))
            });
    }

    /// Whole retries the budget would allow right now (for dashboards and tests).
    pub fn available(&self) -> u64 {
        self.credit_floor();
        let tokens = self.balance.load(Ordering::Relaxed).min(self.capacity) / UNIT;
        u64::try_from(tokens).unwrap_or(0)
    }

    /// Credits the floor for the time elapsed since the last credit.
    ///
    /// Only the time that whole units (millionths of a token) were credited for is
    /// consumed; the rest carries over to the next credit, so checks made more often than
    /// one unit's worth of time still add up to the floor's rate.
    fn credit_floor(&self) {
        if self.per_sec == 0 {
            return;
        }
        let now = u64::try_from(
            Instant::now()
                .saturating_duration_since(self.start)
                .as_nanos(),
        )
        .unwrap_or(u64::MAX);
        // Units per second; at most u32::MAX × 10^6, well within a u128 product.
        let rate = u128::from(self.per_sec) * (UNIT as u128);
        let mut previous = self.credited_ns.load(Ordering::Relaxed);
        let credit = loop {
            if now <= previous {
                return;
            }
            let elapsed = u128::from(now - previous);
            let units = elapsed * rate / 1_000_000_000;
            if units == 0 {
                // Less than one unit's worth of time: leave it for the next credit.
                return;
            }
            // The time those units stand for, rounded up: never more than `elapsed`
            // (`units` was rounded down), so no credit is given twice.
            let used = (units * 1_000_000_000).div_ceil(rate);
            let used = u64::try_from(used).unwrap_or(u64::MAX);
            match self.credited_ns.compare_exchange_weak(
                previous,
                previous.saturating_add(used),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break units,
                Err(actual) => previous = actual,
            }
        };
        let credit = i64::try_from(credit).unwrap_or(i64::MAX).min(self.capacity);
        // Keep the stored balance bounded: credit only up to the capacity.
        let _ = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(
                    b.min(self.capacity)
                        .saturating_add(credit)
                        .min(self.capacity),
                )
            });
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &(self.deposit as f64 / UNIT as f64))
            .field("min_per_sec", &self.per_sec)
            .field("burst", &(self.capacity / UNIT))
            .field(
                "balance",
                &(self.balance.load(Ordering::Relaxed).min(self.capacity) as f64 / UNIT as f64),
            )
            .finish()
    }
}
