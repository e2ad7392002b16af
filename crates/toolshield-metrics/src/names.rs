//! Metric names and label values: one vocabulary (docs/observability.md).

use toolshield_contract::ErrorKind;

/// `tool_execution_total{tool,status}`: logical calls.
pub const TOOL_EXECUTION_TOTAL: &str = "tool_execution_total";
/// `tool_duration_seconds{tool,status}`: duration of logical calls (histogram).
pub const TOOL_DURATION_SECONDS: &str = "tool_duration_seconds";
/// `tool_attempts_total{tool,outcome}`: attempts, retries included.
pub const TOOL_ATTEMPTS_TOTAL: &str = "tool_attempts_total";
/// `tool_errors_total{tool,code}`: failed logical calls by canonical code.
pub const TOOL_ERRORS_TOTAL: &str = "tool_errors_total";
/// `tool_retries_total{tool,code}`: retries, by the code of the failure that caused them.
pub const TOOL_RETRIES_TOTAL: &str = "tool_retries_total";
/// `tool_slow_calls_total{tool}`: successes past the soft threshold.
pub const TOOL_SLOW_CALLS_TOTAL: &str = "tool_slow_calls_total";
/// `tool_cache_hits_total{tool}`: calls answered from the result cache.
pub const TOOL_CACHE_HITS_TOTAL: &str = "tool_cache_hits_total";
/// `tool_cache_misses_total{tool}`: read-only calls the cache could not answer.
pub const TOOL_CACHE_MISSES_TOTAL: &str = "tool_cache_misses_total";
/// `idempotency_cache_hits_total{tool}`: calls replayed from an idempotency record.
pub const IDEMPOTENCY_CACHE_HITS_TOTAL: &str = "idempotency_cache_hits_total";
/// `idempotency_unrecorded_total{tool}`: calls whose tool ran but whose idempotency record
/// could not be written (`provenance.unrecorded`): a duplicate may not be deduplicated.
pub const IDEMPOTENCY_UNRECORDED_TOTAL: &str = "idempotency_unrecorded_total";
/// `circuit_breaker_state{key,state}`: 1 for the current state, 0 for the others.
pub const CIRCUIT_BREAKER_STATE: &str = "circuit_breaker_state";
/// `circuit_breaker_transitions_total{key,from,to}`.
pub const CIRCUIT_BREAKER_TRANSITIONS_TOTAL: &str = "circuit_breaker_transitions_total";
/// `circuit_breaker_rejections_total{key}`.
pub const CIRCUIT_BREAKER_REJECTIONS_TOTAL: &str = "circuit_breaker_rejections_total";

/// The label value for a tool name outside the registered set.
pub const OTHER_TOOL: &str = "other";

/// The `status` of a logical call and the `outcome` of an attempt: the same five values
/// as the `status` of the `ToolResult` envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Succeeded.
    Success,
    /// Failed with any code not listed below.
    Error,
    /// `TIMEOUT`.
    Timeout,
    /// `CIRCUIT_OPEN`: rejected by a breaker.
    CircuitOpen,
    /// `CANCELLED`.
    Cancelled,
}

impl Status {
    /// Every status, in label order.
    pub const ALL: [Status; 5] = [
        Status::Success,
        Status::Error,
        Status::Timeout,
        Status::CircuitOpen,
        Status::Cancelled,
    ];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::CircuitOpen => "circuit_open",
            Status::Cancelled => "cancelled",
        }
    }

    /// The status of a failure of `kind`.
    pub fn of_kind(kind: ErrorKind) -> Status {
        match kind {
            ErrorKind::Timeout => Status::Timeout,
            ErrorKind::CircuitOpen => Status::CircuitOpen,
            ErrorKind::Cancelled => Status::Cancelled,
            _ => Status::Error,
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// Label values of `code`: the canonical codes of [`ErrorKind::ALL`].
pub(crate) const CODES: usize = ErrorKind::ALL.len();

/// The index of `kind` in [`ErrorKind::ALL`].
pub(crate) fn code_index(kind: ErrorKind) -> usize {
    ErrorKind::ALL
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(CODES - 1)
}
