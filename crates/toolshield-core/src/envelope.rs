//! The never-throw envelope handed to an agent or over the wire.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ErrorKind, Provenance, ToolError, ToolResponse};

/// The status of a finished call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    /// The tool answered.
    Success,
    /// The call failed (any kind not listed below).
    Error,
    /// The call ran out of time.
    Timeout,
    /// The breaker was open; the tool was not called.
    CircuitOpen,
    /// The caller cancelled the call.
    Cancelled,
}

/// At most this many bytes of an error's message reach a [`ToolResult`]: a message may
/// come from the tool (or a remote server behind it), so the envelope gets it on one line,
/// control characters and line separators turned into spaces, and cut with `…` past this
/// length.
pub const MAX_ENVELOPE_MESSAGE: usize = 512;

/// The error part of a [`ToolResult`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultError {
    /// The stable code (`RATE_LIMITED`, ...).
    pub code: String,
    /// The message, on one line and at most [`MAX_ENVELOPE_MESSAGE`] bytes.
    pub message: String,
    /// Whether calling again may succeed.
    pub retriable: bool,
}

/// The never-throw result of a call: every outcome, success or not, is a value that
/// serialises to the same JSON shape (camelCase):
///
/// ```json
/// {"status": "success", "data": {...}, "error": null, "durationMs": 12,
///  "fromCache": false, "provenance": {...}}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// success, error, timeout, circuit_open or cancelled.
    pub status: ToolStatus,
    /// The output on success, `null` otherwise.
    pub data: Option<Value>,
    /// The error, `null` on success.
    pub error: Option<ToolResultError>,
    /// How long the call took, in milliseconds.
    pub duration_ms: u64,
    /// Whether the data came from a store instead of a fresh execution: a cache hit or an
    /// idempotent replay (`provenance` says which).
    pub from_cache: bool,
    /// Where the data came from; for an error, the tool, its source, the attempts and
    /// the duration when known.
    pub provenance: Option<Provenance>,
}

impl ToolResult {
    /// Whether the call succeeded.
    pub fn is_success(&self) -> bool {
        self.status == ToolStatus::Success
    }
}

impl From<ToolResponse> for ToolResult {
    fn from(res: ToolResponse) -> Self {
        ToolResult {
            status: ToolStatus::Success,
            duration_ms: res
                .provenance
                .duration
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            // A replayed idempotent result is served from a store too: a duplicate
            // sequential request returns the stored result with `fromCache: true`.
            from_cache: res.provenance.cache_hit || res.provenance.replayed,
            data: Some(res.output),
            error: None,
            provenance: Some(res.provenance.into_inner()),
        }
    }
}

impl From<ToolError> for ToolResult {
    fn from(err: ToolError) -> Self {
        let status = match err.kind() {
            ErrorKind::Timeout => ToolStatus::Timeout,
            ErrorKind::CircuitOpen => ToolStatus::CircuitOpen,
            ErrorKind::Cancelled => ToolStatus::Cancelled,
            _ => ToolStatus::Error,
        };
        let duration = err.elapsed();
        let duration_ms = duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let known = err.attempts() > 0 || duration.is_some() || err.provenance_tool().is_some();
        let provenance = known.then(|| Provenance {
            tool: err.provenance_tool().cloned(),
            source: err.provenance_source().cloned(),
            attempts: err.attempts(),
            duration,
            ..Provenance::default()
        });
        ToolResult {
            status,
            data: None,
            error: Some(ToolResultError {
                code: err.code().to_owned(),
                message: crate::printable(err.message(), MAX_ENVELOPE_MESSAGE).into_owned(),
                retriable: err.is_retriable(),
            }),
            duration_ms: duration_ms.unwrap_or(0),
            from_cache: false,
            provenance,
        }
    }
}

impl From<Result<ToolResponse, ToolError>> for ToolResult {
    fn from(result: Result<ToolResponse, ToolError>) -> Self {
        match result {
            Ok(res) => res.into(),
            Err(err) => err.into(),
        }
    }
}
