//! How long to wait before a retry: the [`Backoff`] trait and the built-in
//! [`BackoffStrategy`] (exponential with full, equal or no jitter; decorrelated jitter;
//! a fixed uniform range; none).

use std::time::Duration;

use toolshield_contract::config::{Problems, MAX_DURATION};

/// Decides the wait before a retry. Replace it with
/// [`RetryLayer::with_backoff`](crate::RetryLayer::with_backoff).
///
/// Implementations must never panic: whatever the numbers, return a duration.
pub trait Backoff: Send + Sync {
    /// The wait before retry number `retry` (1 for the wait before the second attempt),
    /// given the backoff's previous delay (zero before the first retry; a wait a peer asked
    /// for with `Retry-After` is not one) and a random source.
    fn wait(&self, retry: u32, previous: Duration, rng: &mut fastrand::Rng) -> Duration;
}

impl<F> Backoff for F
where
    F: Fn(u32, Duration, &mut fastrand::Rng) -> Duration + Send + Sync,
{
    fn wait(&self, retry: u32, previous: Duration, rng: &mut fastrand::Rng) -> Duration {
        self(retry, previous, rng)
    }
}

/// How much randomness an exponential backoff adds to its nominal wait `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Jitter {
    /// Uniform in `[0, d]` (AWS "full jitter"): the best spread, the default.
    #[default]
    Full,
    /// Uniform in `[d/2, d]` (AWS "equal jitter"): never shorter than half the nominal wait.
    Equal,
    /// Exactly `d`.
    None,
}

/// The built-in backoff strategies, usable from configuration files.
///
/// In a config file the strategy is tagged by `strategy`:
///
/// ```
/// use toolshield_retry::BackoffStrategy;
///
/// let b: BackoffStrategy = serde_json::from_str(
///     r#"{"strategy": "exponential", "base": "500ms", "factor": 2.0, "cap": "5s", "jitter": "full"}"#,
/// ).unwrap();
/// assert_eq!(b, BackoffStrategy::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(tag = "strategy", rename_all = "snake_case", deny_unknown_fields)
)]
pub enum BackoffStrategy {
    /// `min(cap, base × factor^(retry − 1))`, then jittered.
    Exponential {
        /// The nominal wait before the first retry.
        #[cfg_attr(
            feature = "serde",
            serde(with = "toolshield_contract::config::duration")
        )]
        base: Duration,
        /// The growth factor (at least 1).
        factor: f64,
        /// The longest nominal wait.
        #[cfg_attr(
            feature = "serde",
            serde(with = "toolshield_contract::config::duration")
        )]
        cap: Duration,
        /// The jitter applied to the nominal wait.
        #[cfg_attr(feature = "serde", serde(default))]
        jitter: Jitter,
    },
    /// AWS "decorrelated jitter": `min(cap, uniform[base, 3 × previous])`, starting from
    /// `base`.
    Decorrelated {
        /// The shortest wait, and the starting point.
        #[cfg_attr(
            feature = "serde",
            serde(with = "toolshield_contract::config::duration")
        )]
        base: Duration,
        /// The longest wait.
        #[cfg_attr(
            feature = "serde",
            serde(with = "toolshield_contract::config::duration")
        )]
        cap: Duration,
    },
    /// Uniform in `[min, max]` before every retry.
    Fixed {
        /// The shortest wait.
        #[cfg_attr(
            feature = "serde",
            serde(with = "toolshield_contract::config::duration")
        )]
        min: Duration,
        /// The longest wait.
        #[cfg_attr(
            feature = "serde",
            serde(with = "toolshield_contract::config::duration")
        )]
        max: Duration,
    },
    /// Retry at once.
    None,
}

impl Default for BackoffStrategy {
    /// Exponential from 500 ms, factor 2, capped at 5 s, full jitter: the default.
    fn default() -> Self {
        BackoffStrategy::Exponential {
            base: Duration::from_millis(500),
            factor: 2.0,
            cap: Duration::from_secs(5),
            jitter: Jitter::Full,
        }
    }
}

/// `d`, or [`MAX_DURATION`] when `d` is longer (`const`, unlike `Ord::min`).
const fn bounded(d: Duration) -> Duration {
    if d.as_nanos() > MAX_DURATION.as_nanos() {
        MAX_DURATION
    } else {
        d
    }
}

impl BackoffStrategy {
    /// Exponential backoff: `min(cap, base × factor^(retry − 1))` with `jitter`.
    ///
    /// What a configuration file would be refused for
    /// ([`RetryConfig::validate`](crate::RetryConfig::validate) lists it) is made valid
    /// here, so a built strategy always passes [`check`](Self::check): `base` and `cap`
    /// longer than [`MAX_DURATION`] (366 days) are clamped to it, a `base` above `cap` is
    /// lowered to `cap` (the ceiling of every wait), and a `factor` below 1 (or not a number) becomes 1.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use toolshield_retry::{BackoffStrategy, Jitter};
    /// let s = BackoffStrategy::exponential(Duration::from_secs(2), 0.5, Duration::from_secs(1), Jitter::None);
    /// assert_eq!(s, BackoffStrategy::exponential(Duration::from_secs(1), 1.0, Duration::from_secs(1), Jitter::None));
    /// ```
    #[must_use]
    pub const fn exponential(base: Duration, factor: f64, cap: Duration, jitter: Jitter) -> Self {
        let cap = bounded(cap);
        let base = bounded(base);
        BackoffStrategy::Exponential {
            // The cap is the ceiling of every wait: a base above it is lowered to it.
            base: if base.as_nanos() > cap.as_nanos() {
                cap
            } else {
                base
            },
            // `!(factor >= 1.0)` is also true for NaN.
            factor: if factor.is_finite() && factor >= 1.0 {
                factor
            } else if factor == f64::INFINITY {
                f64::MAX
            } else {
                1.0
            },
            cap,
            jitter,
        }
    }

    /// Decorrelated jitter between `base` and `cap`, each clamped to [`MAX_DURATION`].
    /// Made valid as [`exponential`](Self::exponential) is: a zero `base` (from which
    /// the waits could never grow) becomes 1 ms (and a cap below that, 1 ms), and a `base`
    /// above `cap` is lowered to it.
    #[must_use]
    pub const fn decorrelated(base: Duration, cap: Duration) -> Self {
        const MIN: Duration = Duration::from_millis(1);
        let cap = bounded(cap);
        let cap = if cap.as_nanos() < MIN.as_nanos() {
            MIN
        } else {
            cap
        };
        let base = bounded(base);
        let base = if base.is_zero() {
            MIN
        } else if base.as_nanos() > cap.as_nanos() {
            cap
        } else {
            base
        };
        BackoffStrategy::Decorrelated { base, cap }
    }

    /// A uniform wait in `[min, max]` before every retry, each clamped to
    /// [`MAX_DURATION`]. Bounds given in the wrong order are swapped, so
    /// `fixed_range(500ms, 200ms)` is `fixed_range(200ms, 500ms)`, which a configuration
    /// file would be told to write.
    #[must_use]
    pub const fn fixed_range(min: Duration, max: Duration) -> Self {
        let (min, max) = (bounded(min), bounded(max));
        if min.as_nanos() <= max.as_nanos() {
            BackoffStrategy::Fixed { min, max }
        } else {
            BackoffStrategy::Fixed { min: max, max: min }
        }
    }

    /// No wait between attempts.
    #[must_use]
    pub const fn none() -> Self {
        BackoffStrategy::None
    }

    /// Records every problem of this strategy under `prefix` (e.g. `backoff`).
    pub fn check(&self, prefix: &str, problems: &mut Problems) {
        match *self {
            BackoffStrategy::Exponential {
                base, factor, cap, ..
            } => {
                problems.check_duration(base, format!("{prefix}.base"));
                problems.check_duration(cap, format!("{prefix}.cap"));
                problems.check(
                    factor.is_finite() && factor >= 1.0,
                    format!("{prefix}.factor"),
                    format_args!("must be a finite number of at least 1, got {factor}"),
                );
                problems.check(
                    base <= cap,
                    format!("{prefix}.base"),
                    format_args!("base {base:?} > cap {cap:?}"),
                );
            }
            BackoffStrategy::Decorrelated { base, cap } => {
                problems.check_duration(base, format!("{prefix}.base"));
                problems.check_duration(cap, format!("{prefix}.cap"));
                problems.check(
                    !base.is_zero(),
                    format!("{prefix}.base"),
                    "must be more than zero (decorrelated jitter grows from it)",
                );
                problems.check(
                    base <= cap,
                    format!("{prefix}.base"),
                    format_args!("base {base:?} > cap {cap:?}"),
                );
            }
            BackoffStrategy::Fixed { min, max } => {
                problems.check_duration(min, format!("{prefix}.min"));
                problems.check_duration(max, format!("{prefix}.max"));
                problems.check(
                    min <= max,
                    format!("{prefix}.min"),
                    format_args!("min {min:?} > max {max:?}"),
                );
            }
            BackoffStrategy::None => {}
        }
    }
}

/// Nanoseconds of `d`, saturating at `u64::MAX` (584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A uniform duration in `[lo, hi]` (bounds swapped if reversed: never panics).
pub(crate) fn uniform(lo: Duration, hi: Duration, rng: &mut fastrand::Rng) -> Duration {
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
    Duration::from_nanos(rng.u64(nanos(lo)..=nanos(hi)))
}

/// `min(cap, base × factor^(retry − 1))`, robust to any numbers.
fn exponential_nominal(base: Duration, factor: f64, cap: Duration, retry: u32) -> Duration {
    let exp = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
    let secs = base.as_secs_f64() * factor.powi(exp);
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO.min(cap);
    }
    if secs >= cap.as_secs_f64() {
        return cap;
    }
    Duration::try_from_secs_f64(secs).map_or(cap, |d| d.min(cap))
}

impl Backoff for BackoffStrategy {
    fn wait(&self, retry: u32, previous: Duration, rng: &mut fastrand::Rng) -> Duration {
        match *self {
            BackoffStrategy::Exponential {
                base,
                factor,
                cap,
                jitter,
            } => {
                let d = exponential_nominal(base, factor, cap, retry);
                match jitter {
                    Jitter::Full => uniform(Duration::ZERO, d, rng),
                    Jitter::Equal => {
                        let half = d / 2;
                        half + uniform(Duration::ZERO, d - half, rng)
                    }
                    Jitter::None => d,
                }
            }
            BackoffStrategy::Decorrelated { base, cap } => {
                let previous = if previous.is_zero() { base } else { previous };
                let hi = previous.saturating_mul(3).max(base);
                uniform(base, hi, rng).min(cap)
            }
            BackoffStrategy::Fixed { min, max } => uniform(min, max, rng),
            BackoffStrategy::None => Duration::ZERO,
        }
    }
}
