use std::time::Duration;

use toolshield_contract::config::Problems;
use toolshield_contract::ConfigError;

/// What a rate limit keys on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum RateKey {
    /// The name the request gives (the tool, the host).
    #[default]
    Tool,
    /// The caller id; calls without one share a bucket.
    Caller,
    /// The agent run id; calls without one share a bucket.
    Run,
}

/// What a call over the limit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum OnLimit {
    /// Wait for its turn when the wait fits `max_wait` and the call's deadline; else
    /// rejected.
    Wait,
    /// Rejected at once with `RATE_LIMITED` and the exact `retry_after`.
    #[default]
    Reject,
}

/// What a call does when the store fails (Redis down or slow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum OnStoreError {
    /// Fail open: the call runs unlimited (counted in `store_errors`).
    #[default]
    Allow,
    /// Fail closed: the call fails with `STORE_UNAVAILABLE`.
    Reject,
}

/// Configuration of a rate limit: `rate` calls per `period`, bursts of `burst`.
///
/// ```
/// use std::time::Duration;
/// use toolshield_ratelimit::{OnLimit, RateKey, RateLimitConfig};
///
/// let cfg: RateLimitConfig = serde_json::from_str(
///     r#"{"rate": 60, "period": "1m", "burst": 10, "key": "caller", "on_limit": "wait", "max_wait": "2s"}"#,
/// ).unwrap();
/// assert_eq!(cfg.limit().interval(), Duration::from_secs(1));
/// assert_eq!((cfg.key, cfg.on_limit), (RateKey::Caller, OnLimit::Wait));
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct RateLimitConfig {
    /// Calls per period. Default 10.
    pub rate: u32,
    /// The period. Default 1 s.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub period: Duration,
    /// The most calls admitted at once; `null` (the default) is `rate`.
    pub burst: Option<u32>,
    /// What the buckets are keyed on. Default the tool.
    pub key: RateKey,
    /// Wait for a turn, or reject. Default reject.
    pub on_limit: OnLimit,
    /// The longest wait in `wait` mode (never past the call's deadline). Default 1 s.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub max_wait: Duration,
    /// Fail open or closed when the store fails. Default open (`allow`).
    pub on_store_error: OnStoreError,
    /// The in-memory store's bound on keys. Default 10,000.
    pub max_keys: u64,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            rate: 10,
            period: Duration::from_secs(1),
            burst: None,
            key: RateKey::Tool,
            on_limit: OnLimit::Reject,
            max_wait: Duration::from_secs(1),
            on_store_error: OnStoreError::Allow,
            max_keys: 10_000,
        }
    }
}

impl RateLimitConfig {
    /// The rate this configuration describes.
    #[must_use]
    pub fn limit(&self) -> crate::RateLimit {
        crate::RateLimit::new(self.rate, self.period, self.burst.unwrap_or(self.rate))
    }

    /// Every problem: a rate and burst of at least 1, a period above zero and at most
    /// [`MAX_DURATION`](toolshield_contract::config::MAX_DURATION), at most one call per
    /// microsecond (the precision of the shared store), a burst tolerance and `max_wait`
    /// within `MAX_DURATION`, `max_keys` from 1 to
    /// [`MAX_KEYS`](toolshield_contract::config::MAX_KEYS).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check(self.rate >= 1, "rate", "must be at least 1");
        p.check(!self.period.is_zero(), "period", "must be greater than 0");
        p.check_duration(self.period, "period");
        if self.rate >= 1 && !self.period.is_zero() {
            p.check(
                self.period / self.rate >= Duration::from_micros(1),
                "rate",
                format_args!(
                    "{} per {:?} is more than one call per microsecond",
                    self.rate, self.period
                ),
            );
        }
        if let Some(burst) = self.burst {
            p.check(burst >= 1, "burst", "must be at least 1");
            if self.rate >= 1 && burst >= 1 {
                let tolerance = (self.period / self.rate).checked_mul(burst - 1);
                p.check(
                    tolerance.is_some_and(|t| t <= toolshield_contract::config::MAX_DURATION),
                    "burst",
                    "burst times the interval is longer than the longest duration accepted",
                );
            }
        }
        p.check_duration(self.max_wait, "max_wait");
        p.check(
            self.on_limit == OnLimit::Reject || !self.max_wait.is_zero(),
            "max_wait",
            "must be greater than 0 when on_limit is wait",
        );
        p.check_max_keys(self.max_keys, "max_keys");
        p.into_result()
    }
}
