//! [`BreakerConfig`]: thresholds, windows, waits, probes and registry bounds.

use std::path::PathBuf;
use std::time::Duration;

use toolshield_contract::config::Problems;
use toolshield_contract::ConfigError;

/// The sliding window the failure and slow-call rates are computed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)
)]
pub enum WindowConfig {
    /// The last `size` recorded calls. Needs no clock read per call.
    Count {
        /// How many calls the window holds.
        size: u32,
    },
    /// The calls of the last `duration`, in `buckets` buckets of `duration / buckets`
    /// each. Needs one clock read per recorded call.
    Time {
        /// How far back the window reaches.
        #[cfg_attr(
            feature = "serde",
            serde(with = "toolshield_contract::config::duration")
        )]
        duration: Duration,
        /// How many buckets the window is cut into (the window slides a bucket at a time).
        buckets: u32,
    },
}

impl WindowConfig {
    /// A count window of the last `size` calls.
    #[must_use]
    pub const fn count(size: u32) -> Self {
        WindowConfig::Count { size }
    }

    /// A time window of the last `duration`, cut into `buckets` buckets.
    #[must_use]
    pub const fn time(duration: Duration, buckets: u32) -> Self {
        WindowConfig::Time { duration, buckets }
    }
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig::Count { size: 100 }
    }
}

/// Configuration of every breaker of a [`BreakerRegistry`](crate::BreakerRegistry).
///
/// Defaults: trips on 5 consecutive failures, on a failure rate of 50 % of
/// the last 100 calls once 20 were recorded, or on a slow-call rate of 100 %; stays open
/// 30 s; then admits 1 probe, and 1 success closes it.
///
/// ```
/// use toolshield_breaker::BreakerConfig;
///
/// let config: BreakerConfig = serde_json::from_str(r#"{
///     "consecutive_failures": 3,
///     "window": {"type": "time", "duration": "60s", "buckets": 12},
///     "open_wait": "10s"
/// }"#).unwrap();
/// assert!(config.validate().is_ok());
/// assert_eq!(config.min_calls, 20);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct BreakerConfig {
    /// Opens after this many failures in a row. `0` turns this trip off.
    pub consecutive_failures: u32,
    /// The window the rates are computed over.
    pub window: WindowConfig,
    /// The rates are not evaluated before the window holds this many calls.
    pub min_calls: u32,
    /// Opens when failures make up at least this percentage of the window (0 < x <= 100).
    pub failure_rate: f64,
    /// Opens when slow calls make up at least this percentage of the window
    /// (0 < x <= 100); `None` turns slow-call tripping off. A slow half-open probe
    /// counts as a failed probe while this is on.
    pub slow_call_rate: Option<f64>,
    /// A call slower than this counts as slow even when no timeout layer marked it.
    /// `None` (the default) relies on the timeout layer's soft threshold alone, and
    /// costs no clock read per call.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration::option")
    )]
    pub slow_call_duration: Option<Duration>,
    /// How long the breaker stays open before it admits probes.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub open_wait: Duration,
    /// Each re-open without a close in between multiplies the wait by this (>= 1).
    /// `1.0` (the default) keeps the wait fixed.
    pub open_wait_multiplier: f64,
    /// The cap of the growing wait.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub max_open_wait: Duration,
    /// How many probes may run at once while half-open (K).
    pub half_open_permits: u32,
    /// How many successful probes close the breaker (S).
    pub half_open_successes: u32,
    /// The most keys the registry holds; idle closed breakers are evicted to make room
    /// (calls run at most one such sweep per second). Calls for a new key while the
    /// registry is full and nothing can be evicted run under a breaker that is not kept.
    pub max_keys: usize,
    /// A closed breaker not used for this long may be evicted (between one and two
    /// times this, see `docs/breaker.md`).
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub idle_ttl: Duration,
    /// Appends every transition and override to this file as JSON lines, from a writer
    /// thread (see [`BreakerRegistry::log_events_to`](crate::BreakerRegistry::log_events_to)).
    pub events_file: Option<PathBuf>,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            window: WindowConfig::default(),
            min_calls: 20,
            failure_rate: 50.0,
            slow_call_rate: Some(100.0),
            slow_call_duration: None,
            open_wait: Duration::from_secs(30),
            open_wait_multiplier: 1.0,
            max_open_wait: Duration::from_secs(300),
            half_open_permits: 1,
            half_open_successes: 1,
            max_keys: 10_000,
            idle_ttl: Duration::from_secs(600),
            events_file: None,
        }
    }
}

const MAX_PERMITS: u32 = 0xFFFF;
const MAX_COUNT_WINDOW: u32 = 1 << 20;
const MAX_BUCKETS: u32 = 4096;

impl BreakerConfig {
    /// Checks the configuration and returns every problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        match self.window {
            WindowConfig::Count { size } => {
                p.check(
                    (1..=MAX_COUNT_WINDOW).contains(&size),
                    "window.size",
                    format_args!("must be between 1 and {MAX_COUNT_WINDOW}, got {size}"),
                );
                p.check(
                    self.min_calls <= size,
                    "min_calls",
                    format_args!(
                        "{} is more than the window size {size}: the rates could never trip",
                        self.min_calls
                    ),
                );
            }
            WindowConfig::Time { duration, buckets } => {
                p.check(
                    (1..=MAX_BUCKETS).contains(&buckets),
                    "window.buckets",
                    format_args!("must be between 1 and {MAX_BUCKETS}, got {buckets}"),
                );
                p.check(
                    buckets == 0 || duration / buckets.max(1) >= Duration::from_millis(1),
                    "window.duration",
                    format_args!("{duration:?} cut into {buckets} buckets gives buckets under 1ms"),
                );
            }
        }
        p.check(self.min_calls >= 1, "min_calls", "must be at least 1");
        p.check(
            self.failure_rate > 0.0 && self.failure_rate <= 100.0,
            "failure_rate",
            format_args!(
                "must be a percentage in (0, 100], got {}",
                self.failure_rate
            ),
        );
        if let Some(rate) = self.slow_call_rate {
            p.check(
                rate > 0.0 && rate <= 100.0,
                "slow_call_rate",
                format_args!("must be a percentage in (0, 100], got {rate}"),
            );
        }
        if let Some(d) = self.slow_call_duration {
            p.check(!d.is_zero(), "slow_call_duration", "must be more than zero");
        }
        p.check(
            !self.open_wait.is_zero(),
            "open_wait",
            "must be more than zero",
        );
        p.check_duration(self.open_wait, "open_wait");
        p.check_duration(self.max_open_wait, "max_open_wait");
        p.check_duration(self.idle_ttl, "idle_ttl");
        if let Some(d) = self.slow_call_duration {
            p.check_duration(d, "slow_call_duration");
        }
        if let WindowConfig::Time { duration, .. } = self.window {
            p.check_duration(duration, "window.duration");
        }
        p.check(
            self.open_wait_multiplier.is_finite() && self.open_wait_multiplier >= 1.0,
            "open_wait_multiplier",
            format_args!("must be at least 1.0, got {}", self.open_wait_multiplier),
        );
        p.check(
            self.max_open_wait >= self.open_wait,
            "max_open_wait",
            format_args!(
                "{:?} is less than open_wait {:?}",
                self.max_open_wait, self.open_wait
            ),
        );
        p.check(
            (1..=MAX_PERMITS).contains(&self.half_open_permits),
            "half_open_permits",
            format_args!(
                "must be between 1 and {MAX_PERMITS}, got {}",
                self.half_open_permits
            ),
        );
        p.check(
            (1..=MAX_PERMITS).contains(&self.half_open_successes),
            "half_open_successes",
            format_args!(
                "must be between 1 and {MAX_PERMITS}, got {}",
                self.half_open_successes
            ),
        );
        p.check_max_keys(u64::try_from(self.max_keys).unwrap_or(u64::MAX), "max_keys");
        p.check(
            !self.idle_ttl.is_zero(),
            "idle_ttl",
            "must be more than zero",
        );
        p.into_result()
    }

    /// The open wait after the `opens`-th consecutive open (1 for the first).
    pub(crate) fn wait_for(&self, opens: u32) -> Duration {
        if opens <= 1 || self.open_wait_multiplier <= 1.0 {
            return self.open_wait.min(self.max_open_wait);
        }
        let factor = self
            .open_wait_multiplier
            .powi(opens.saturating_sub(1).min(64) as i32);
        let secs = self.open_wait.as_secs_f64() * factor;
        if !secs.is_finite() || secs >= self.max_open_wait.as_secs_f64() {
            self.max_open_wait
        } else {
            Duration::from_secs_f64(secs)
        }
    }
}
