//! Serde configuration of the retry layer, validated before use.

use std::time::Duration;

use toolshield_contract::config::Problems;
use toolshield_contract::ConfigError;

use crate::BackoffStrategy;

/// Configuration of a [`RetryLayer`](crate::RetryLayer).
///
/// ```
/// use std::time::Duration;
/// use toolshield_retry::{BackoffStrategy, RetryConfig};
///
/// let cfg: RetryConfig = serde_json::from_str(r#"{
///     "max_attempts": 4,
///     "backoff": {"strategy": "fixed", "min": "200ms", "max": "500ms"},
///     "rate_limit_backoff": "10s"
/// }"#).unwrap();
/// assert_eq!(cfg.backoff, BackoffStrategy::fixed_range(Duration::from_millis(200), Duration::from_millis(500)));
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct RetryConfig {
    /// Attempts in total, the first included (1 = no retry). Default 3.
    pub max_attempts: u32,
    /// The wait between attempts. Default: exponential from 500 ms, factor 2, cap 5 s,
    /// full jitter.
    pub backoff: BackoffStrategy,
    /// The wait after a `RATE_LIMITED` error that carries no `retry_after`. Default 30 s.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub rate_limit_backoff: Duration,
    /// The longest `retry_after` a failure may ask for and still be retried. A longer one
    /// (a `Retry-After: 86400`) ends the call at once with that error, its `retry_after`
    /// kept for the caller and the model. Default 60 s.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub max_retry_after: Duration,
    /// The least time that must be left before the call's deadline when a retry would
    /// start; with less, the retry is not started and the last error is returned.
    /// Without a deadline it has no effect. Default 100 ms.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub min_attempt_time: Duration,
    /// The retry budget shared by every clone of the layer.
    pub budget: BudgetConfig,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            backoff: BackoffStrategy::default(),
            rate_limit_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            min_attempt_time: Duration::from_millis(100),
            budget: BudgetConfig::default(),
        }
    }
}

impl RetryConfig {
    /// Every problem of the configuration at once, each with its field path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::new();
        problems.check(
            self.max_attempts >= 1,
            "max_attempts",
            "must be at least 1 (the first attempt counts)",
        );
        self.backoff.check("backoff", &mut problems);
        problems.check_duration(self.rate_limit_backoff, "rate_limit_backoff");
        problems.check_duration(self.max_retry_after, "max_retry_after");
        problems.check_duration(self.min_attempt_time, "min_attempt_time");
        problems.extend("budget", self.budget.validate());
        problems.into_result()
    }
}

/// Configuration of the [`RetryBudget`](crate::RetryBudget).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct BudgetConfig {
    /// Whether retries are limited by a budget at all. Default true.
    pub enabled: bool,
    /// The fraction of calls retries may add (0.2 = 20 %). Default 0.2.
    pub ratio: f64,
    /// Retries always allowed per second, whatever the traffic. Default 10.
    pub min_per_sec: u32,
    /// The most tokens the bucket holds: the largest burst of retries. Default 100
    /// (ten seconds of the floor).
    pub burst: u32,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            enabled: true,
            ratio: 0.2,
            min_per_sec: 10,
            burst: 100,
        }
    }
}

impl BudgetConfig {
    /// Every problem of the budget configuration at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::new();
        if self.enabled {
            problems.check(
                self.ratio.is_finite() && (0.0..=1000.0).contains(&self.ratio),
                "ratio",
                format_args!("must be between 0 and 1000, got {}", self.ratio),
            );
            problems.check(self.burst >= 1, "burst", "must be at least 1");
            problems.check(
                self.ratio > 0.0 || self.min_per_sec > 0,
                "min_per_sec",
                "ratio and min_per_sec are both 0: no retry could ever start (disable the budget instead)",
            );
        }
        problems.into_result()
    }
}
