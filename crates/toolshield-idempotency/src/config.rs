//! Configuration of the idempotency layer.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolshield_core::config::{duration, ConfigError, Problems};

/// What a duplicate does while the first call is still PENDING.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnPending {
    /// Wait (bounded by [`IdempotencyConfig::wait_timeout`]) for the first call's result.
    #[default]
    Wait,
    /// Fail at once with `IN_PROGRESS`.
    FailFast,
}

/// What happens when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Fail with `STORE_UNAVAILABLE`; the tool does not run.
    #[default]
    FailClosed,
    /// Run the tool without dedupe and log a warning.
    FailOpen,
}

/// Configuration of the idempotency layer (defaults in docs/idempotency.md).
///
/// ```
/// use toolshield_idempotency::IdempotencyConfig;
///
/// let cfg: IdempotencyConfig = serde_json::from_str(r#"{"on_pending": "fail_fast", "lease": "10s"}"#).unwrap();
/// assert_eq!(cfg.lease, std::time::Duration::from_secs(10));
/// cfg.validate().unwrap();
/// assert!(serde_json::from_str::<IdempotencyConfig>(r#"{"leese": "10s"}"#).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// Derive a key for calls that carry none: sha256(tool, canonical payload, caller,
    /// time window). When off, a call without a key passes through without dedupe.
    pub derive_keys: bool,
    /// The time window of derived keys.
    #[serde(with = "duration")]
    pub key_window: Duration,
    /// Prefix given keys with the caller id, so two callers never share a record.
    pub scope_keys_by_caller: bool,
    /// How long a COMPLETED record (and an `OUTCOME_UNKNOWN` record) is kept.
    #[serde(with = "duration")]
    pub record_ttl: Duration,
    /// How long a FAILED record (non-retriable failure) is replayed.
    #[serde(with = "duration")]
    pub failed_ttl: Duration,
    /// The lease of a PENDING claim; renewed every third of it while the call runs.
    #[serde(with = "duration")]
    pub lease: Duration,
    /// What a duplicate does while the first call runs.
    pub on_pending: OnPending,
    /// The longest a duplicate waits in [`OnPending::Wait`] before `IN_PROGRESS` (less
    /// when the call's deadline comes first; a cancelled call stops waiting at once).
    #[serde(with = "duration")]
    pub wait_timeout: Duration,
    /// How soon a waiting duplicate first reads the record again; the interval then
    /// doubles up to [`max_poll_interval`](Self::max_poll_interval).
    #[serde(with = "duration")]
    pub poll_interval: Duration,
    /// The longest interval between two reads of a waiting duplicate (a value at or
    /// below `poll_interval` keeps the interval fixed).
    #[serde(with = "duration")]
    pub max_poll_interval: Duration,
    /// What happens when the store cannot be reached.
    pub on_store_error: OnStoreError,
    /// How long a call that ran keeps retrying to write its outcome record when the store
    /// fails (renewing its lease meanwhile), at most until its lease is about to end. Past
    /// it the key is marked `OUTCOME_UNKNOWN` where the store allows, and the response
    /// says the result is unrecorded (`provenance.unrecorded`).
    #[serde(with = "duration")]
    pub record_retry: Duration,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            derive_keys: true,
            key_window: Duration::from_secs(3600),
            scope_keys_by_caller: true,
            record_ttl: Duration::from_secs(24 * 3600),
            failed_ttl: Duration::from_secs(60),
            lease: Duration::from_secs(30),
            on_pending: OnPending::Wait,
            wait_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(50),
            max_poll_interval: Duration::from_millis(800),
            on_store_error: OnStoreError::FailClosed,
            record_retry: Duration::from_secs(2),
        }
    }
}

impl IdempotencyConfig {
    /// Every problem at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        let ms = Duration::from_millis(1);
        p.check(
            self.key_window >= Duration::from_secs(1),
            "key_window",
            "must be at least 1s",
        );
        p.check(self.record_ttl >= ms, "record_ttl", "must be at least 1ms");
        p.check(self.failed_ttl >= ms, "failed_ttl", "must be at least 1ms");
        p.check(
            self.lease >= Duration::from_millis(3),
            "lease",
            "must be at least 3ms",
        );
        p.check(
            self.poll_interval >= ms,
            "poll_interval",
            "must be at least 1ms",
        );
        for (d, field) in [
            (self.key_window, "key_window"),
            (self.record_ttl, "record_ttl"),
            (self.failed_ttl, "failed_ttl"),
            (self.lease, "lease"),
            (self.wait_timeout, "wait_timeout"),
            (self.poll_interval, "poll_interval"),
            (self.max_poll_interval, "max_poll_interval"),
            (self.record_retry, "record_retry"),
        ] {
            p.check_duration(d, field);
        }
        p.check(
            self.poll_interval <= self.wait_timeout || self.on_pending == OnPending::FailFast,
            "poll_interval",
            format_args!(
                "{:?} is longer than wait_timeout {:?}",
                self.poll_interval, self.wait_timeout
            ),
        );
        p.into_result()
    }
}
