use std::time::Duration;

use toolshield_contract::config::Problems;
use toolshield_contract::ConfigError;

/// Timeouts of a call: per attempt (a hard maximum, and an optional idle limit that
/// progress reports reset), soft threshold, and an optional whole-call budget.
///
/// ```
/// use std::time::Duration;
/// use toolshield_timeout::TimeoutConfig;
///
/// let cfg: TimeoutConfig = serde_json::from_str(r#"{"attempt": "4s", "soft": "2s", "total": "10s", "idle": "1s"}"#).unwrap();
/// assert_eq!(cfg.attempt, Duration::from_secs(4));
/// assert_eq!(cfg.idle, Some(Duration::from_secs(1)));
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct TimeoutConfig {
    /// Hard limit of one attempt; fresh for each retry. Default 30 s.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub attempt: Duration,
    /// Soft threshold: a success slower than this is marked slow, not failed. Default 2 s;
    /// `null` turns it off.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration::option")
    )]
    pub soft: Option<Duration>,
    /// Budget of the whole call, retries and backoff included. Default off.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration::option")
    )]
    pub total: Option<Duration>,
    /// Idle limit of one attempt: an attempt that reports no progress for this long is
    /// cut (`TIMEOUT`, "no progress for ..."); each report resets it, and nothing extends
    /// the attempt past `attempt`. Default off (`null`): only `attempt` applies.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration::option")
    )]
    pub idle: Option<Duration>,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        TimeoutConfig {
            attempt: Duration::from_secs(30),
            soft: Some(Duration::from_secs(2)),
            total: None,
            idle: None,
        }
    }
}

impl TimeoutConfig {
    /// Every problem with this configuration: zero or unbounded durations (each at most
    /// [`MAX_DURATION`](toolshield_contract::config::MAX_DURATION)), a soft threshold not below
    /// the attempt timeout, an attempt timeout longer than the total deadline, an idle limit
    /// of zero or longer than the attempt timeout.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check(!self.attempt.is_zero(), "attempt", "must be greater than 0");
        p.check_duration(self.attempt, "attempt");
        if let Some(soft) = self.soft {
            p.check_duration(soft, "soft");
        }
        if let Some(total) = self.total {
            p.check_duration(total, "total");
        }
        if let Some(soft) = self.soft {
            p.check(
                !soft.is_zero(),
                "soft",
                "must be greater than 0 (use null to turn it off)",
            );
            p.check(
                soft < self.attempt,
                "soft",
                format_args!(
                    "soft threshold {soft:?} must be below the attempt timeout {:?}",
                    self.attempt
                ),
            );
        }
        if let Some(total) = self.total {
            p.check(
                !total.is_zero(),
                "total",
                "must be greater than 0 (use null to turn it off)",
            );
            p.check(
                self.attempt <= total,
                "attempt",
                format_args!(
                    "attempt timeout {:?} is longer than the total deadline {total:?}",
                    self.attempt
                ),
            );
        }
        if let Some(idle) = self.idle {
            p.check_duration(idle, "idle");
            p.check(
                !idle.is_zero(),
                "idle",
                "must be greater than 0 (use null to turn it off)",
            );
            p.check(
                idle <= self.attempt,
                "idle",
                format_args!(
                    "idle limit {idle:?} is longer than the attempt timeout {:?}",
                    self.attempt
                ),
            );
        }
        p.into_result()
    }
}
