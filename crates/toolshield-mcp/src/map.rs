//! How MCP results and `rmcp` errors become toolshield responses and errors.

use rmcp::model::{CallToolResult, ErrorCode};
use rmcp::{ErrorData, ServiceError};
use serde_json::Value;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolResponse};

/// What to do with a tool result that says `isError: true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsErrorPolicy {
    /// Keep it as a response: the output is the MCP result with `isError: true` and its
    /// content, so the model can read the tool's own words, and the core classifier
    /// counts it as an `EXECUTION_FAILED` failure (breaker: counted; retry: not retried).
    #[default]
    Keep,
    /// Turn it into a [`ToolError`] of this kind whose message is the result's text, for
    /// servers whose `isError` results are transient (e.g. `UPSTREAM_UNAVAILABLE`, which
    /// the retry layer retries).
    Error(ErrorKind),
}

/// Longest text kept from a server in an error message (an `isError` result's text, a
/// JSON-RPC error's message, a transport error), in bytes.
pub const MAX_MESSAGE: usize = 512;

/// `text` cut to at most [`MAX_MESSAGE`] bytes, on a char boundary.
pub(crate) fn capped(text: &str) -> &str {
    if text.len() <= MAX_MESSAGE {
        return text;
    }
    let mut cut = MAX_MESSAGE;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// The text content of a result, joined by newlines.
pub fn result_text(result: &CallToolResult) -> String {
    let mut text = String::new();
    for block in &result.content {
        if let Some(t) = block.as_text() {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&t.text);
        }
    }
    text
}

/// Maps a completed `tools/call` result.
pub fn map_result(
    tool: &str,
    result: CallToolResult,
    policy: IsErrorPolicy,
) -> Result<ToolResponse, ToolError> {
    let is_error = result.is_error.unwrap_or(false);
    if is_error {
        if let IsErrorPolicy::Error(kind) = policy {
            let text = result_text(&result);
            let text = capped(&text);
            let message = if text.is_empty() {
                format!("mcp tool `{tool}` reported an error")
            } else {
                format!("mcp tool `{tool}` reported an error: {text}")
            };
            return Err(ToolError::new(kind, message));
        }
    }
    let mut output = serde_json::to_value(&result)
        .map_err(|e| ToolError::from_source(ErrorKind::Internal, e))?;
    // The wire form leaves `isError` out when absent; make the flag explicit on failures
    // so `ToolResponse::is_error` (and the classifier) see it.
    if is_error {
        if let Value::Object(map) = &mut output {
            map.insert("isError".to_owned(), Value::Bool(true));
        }
    }
    Ok(ToolResponse::new(output))
}

/// Maps a JSON-RPC error answered by the server. The server's message is cut at
/// [`MAX_MESSAGE`] bytes.
pub fn map_protocol_error(tool: &str, error: &ErrorData) -> ToolError {
    let code = error.code;
    let lower = error.message.to_ascii_lowercase();
    let kind = if code == ErrorCode::METHOD_NOT_FOUND || code == ErrorCode::RESOURCE_NOT_FOUND {
        ErrorKind::NotFound
    } else if code == ErrorCode::INVALID_PARAMS {
        // rmcp's tool router, like most servers, answers an unknown tool with
        // "invalid params: tool not found".
        if lower.contains("not found") || lower.contains("unknown tool") {
            ErrorKind::NotFound
        } else {
            ErrorKind::InvalidInput
        }
    } else if code == ErrorCode::INVALID_REQUEST || code == ErrorCode::PARSE_ERROR {
        ErrorKind::InvalidInput
    } else {
        // INTERNAL_ERROR and server-defined codes: the tool ran and failed.
        ErrorKind::ExecutionFailed
    };
    ToolError::new(
        kind,
        format!(
            "mcp tool `{tool}` failed: {} ({})",
            capped(&error.message),
            code.0
        ),
    )
}

/// Maps an `rmcp` service error of a call that was sent and is safe to repeat (a
/// closed transport is `CONNECTION_FAILED`); see [`map_call_error`].
pub fn map_service_error(tool: &str, error: ServiceError) -> ToolError {
    map_call_error(tool, error, CallKind::Idempotent)
}

/// Maps an `rmcp` service error of a call of `kind` that was handed to the transport.
///
/// The transport closing or failing before the answer (`TransportClosed`,
/// `TransportSend`) may come after the server took the request: for a
/// [`Mutating`](CallKind::Mutating) call that is `OUTCOME_UNKNOWN` (never retried; the
/// idempotency layer keeps the key), for the others `CONNECTION_FAILED` (retriable). A
/// transport already closed before the call is `CONNECTION_FAILED` whatever the kind:
/// [`McpClientService`](crate::McpClientService) checks that before sending.
pub fn map_call_error(tool: &str, error: ServiceError, kind: CallKind) -> ToolError {
    let lost = if kind == CallKind::Mutating {
        ErrorKind::OutcomeUnknown
    } else {
        ErrorKind::ConnectionFailed
    };
    match error {
        ServiceError::McpError(data) => map_protocol_error(tool, &data),
        ServiceError::TransportClosed => {
            ToolError::new(lost, format!("mcp transport closed while calling `{tool}`"))
        }
        ServiceError::TransportSend(e) => ToolError::new(
            lost,
            format!(
                "mcp transport failed while calling `{tool}`: {}",
                capped(&e.to_string())
            ),
        ),
        ServiceError::Timeout { .. } => {
            ToolError::timeout(format!("mcp request for `{tool}` timed out in the client"))
        }
        ServiceError::Cancelled { .. } => {
            ToolError::cancelled(format!("mcp request for `{tool}` was cancelled"))
        }
        other => ToolError::new(
            ErrorKind::ExecutionFailed,
            format!(
                "mcp call of `{tool}` failed: {}",
                capped(&other.to_string())
            ),
        ),
    }
}
