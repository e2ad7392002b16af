use std::time::Duration;

use toolshield_contract::config::Problems;
use toolshield_contract::ConfigError;

/// The most calls in flight a bulkhead accepts (tokio's semaphore bound, rounded down).
pub const MAX_CONCURRENT: usize = 1 << 28;

/// The longest queue a bulkhead accepts.
pub const MAX_QUEUE: usize = 1 << 20;

/// What a bulkhead keys on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum BulkheadKey {
    /// One compartment for the whole layer (one tool's stack).
    #[default]
    Layer,
    /// One per name the request gives (the tool, the host).
    Tool,
    /// One per caller id; calls without one share a compartment.
    Caller,
    /// One per agent run id; calls without one share a compartment.
    Run,
}

/// Configuration of a bulkhead.
///
/// ```
/// use std::time::Duration;
/// use toolshield_bulkhead::{BulkheadConfig, BulkheadKey};
///
/// let cfg: BulkheadConfig = serde_json::from_str(
///     r#"{"max_concurrent": 10, "max_queue": 20, "queue_timeout": "500ms", "key": "caller"}"#,
/// ).unwrap();
/// assert_eq!(cfg.queue_timeout, Duration::from_millis(500));
/// assert_eq!(cfg.key, BulkheadKey::Caller);
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct BulkheadConfig {
    /// At most this many calls in flight per key. Default 25.
    pub max_concurrent: usize,
    /// At most this many calls waiting per key, in FIFO order; `0` rejects at once when
    /// every slot is taken. Default 0.
    pub max_queue: usize,
    /// How long a call may wait in the queue (never past the call's deadline). Default 1 s.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub queue_timeout: Duration,
    /// What the compartments are keyed on. Default the whole layer.
    pub key: BulkheadKey,
    /// With a key other than `layer`: at most this many keys held at once (idle keys are
    /// evicted to make room; when every held key is busy a new key is rejected).
    /// Default 10,000.
    pub max_keys: usize,
}

impl Default for BulkheadConfig {
    fn default() -> Self {
        BulkheadConfig {
            max_concurrent: 25,
            max_queue: 0,
            queue_timeout: Duration::from_secs(1),
            key: BulkheadKey::Layer,
            max_keys: 10_000,
        }
    }
}

impl BulkheadConfig {
    /// Every problem: `max_concurrent` in `1..=MAX_CONCURRENT`, `max_queue` at most
    /// [`MAX_QUEUE`], a queue timeout above zero when there is a queue and at most
    /// [`MAX_DURATION`](toolshield_contract::config::MAX_DURATION), `max_keys` from 1 to
    /// [`MAX_KEYS`](toolshield_contract::config::MAX_KEYS).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check(
            self.max_concurrent >= 1,
            "max_concurrent",
            "must be at least 1",
        );
        p.check(
            self.max_concurrent <= MAX_CONCURRENT,
            "max_concurrent",
            format_args!("must be at most {MAX_CONCURRENT}"),
        );
        p.check(
            self.max_queue <= MAX_QUEUE,
            "max_queue",
            format_args!("must be at most {MAX_QUEUE}"),
        );
        p.check_duration(self.queue_timeout, "queue_timeout");
        p.check(
            self.max_queue == 0 || !self.queue_timeout.is_zero(),
            "queue_timeout",
            "must be greater than 0 when max_queue is above 0",
        );
        p.check_max_keys(u64::try_from(self.max_keys).unwrap_or(u64::MAX), "max_keys");
        p.into_result()
    }
}
