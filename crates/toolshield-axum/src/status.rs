//! The HTTP status of each [`ErrorKind`], and the response a [`ToolError`] becomes.

use std::borrow::Cow;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use toolshield_core::{ErrorKind, ToolError, ToolResultError};

/// The message an `INTERNAL` error is answered with: its own text may hold a panic
/// message or other internals, so it stays in the server's log.
const INTERNAL_MESSAGE: &str = "internal error";

/// The message an `OUTCOME_UNKNOWN` error is answered with.
const OUTCOME_UNKNOWN_MESSAGE: &str =
    "the request may or may not have taken effect; check its effect before sending it again";

/// The HTTP status a [`ToolError`] of `kind` is answered with.
///
/// | kind | status |
/// |---|---|
/// | `INVALID_INPUT` | 400 Bad Request |
/// | `UNAUTHORIZED` | 401 Unauthorized |
/// | `BUDGET_EXHAUSTED` | 403 Forbidden |
/// | `NOT_FOUND` | 404 Not Found |
/// | `IN_PROGRESS` | 409 Conflict |
/// | `IDEMPOTENCY_KEY_REUSED` | 422 Unprocessable Content |
/// | `RATE_LIMITED` | 429 Too Many Requests (+ `Retry-After`) |
/// | `EXECUTION_FAILED`, `OUTCOME_UNKNOWN`, `INTERNAL` | 500 Internal Server Error |
/// | `CONNECTION_FAILED` | 502 Bad Gateway |
/// | `CIRCUIT_OPEN`, `UPSTREAM_UNAVAILABLE`, `STORE_UNAVAILABLE`, `OVERLOADED`, `CANCELLED` | 503 Service Unavailable (+ `Retry-After`) |
/// | `TIMEOUT` | 504 Gateway Timeout |
///
/// `OUTCOME_UNKNOWN` is 500 on purpose: a client's retry policy repeats 502, 503 and 504,
/// and a request whose effect is unknown must not be repeated blindly. A kind added to
/// [`ErrorKind`] later answers 500 until it is given its own status. The reasons for each
/// choice are in `docs/axum.md`.
pub const fn status_for(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorKind::BudgetExhausted => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::InProgress => StatusCode::CONFLICT,
        ErrorKind::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::ConnectionFailed => StatusCode::BAD_GATEWAY,
        ErrorKind::CircuitOpen
        | ErrorKind::UpstreamUnavailable
        | ErrorKind::StoreUnavailable
        | ErrorKind::Overloaded
        | ErrorKind::Cancelled => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorKind::ExecutionFailed | ErrorKind::OutcomeUnknown | ErrorKind::Internal => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The body of an error response: `{"error": {"code", "message", "retriable"}}`, the
/// error part of the [`ToolResult`](toolshield_core::ToolResult) envelope.
#[derive(Serialize)]
struct ErrorBody {
    error: ToolResultError,
}

/// The text a client reads: the error's own message, except for `INTERNAL` (a generic
/// text), `OUTCOME_UNKNOWN` (what the client must do) and an error made from another
/// type's ([`ToolError::is_foreign`]: its text was written for its author, not a client).
fn public_message(error: &ToolError) -> Cow<'static, str> {
    match error.kind() {
        ErrorKind::Internal => Cow::Borrowed(INTERNAL_MESSAGE),
        ErrorKind::OutcomeUnknown => Cow::Borrowed(OUTCOME_UNKNOWN_MESSAGE),
        _ if error.is_foreign() => Cow::Borrowed(FOREIGN_MESSAGE),
        _ => Cow::Owned(error.message().to_owned()),
    }
}

/// What a client reads in place of the text of an error that is not a `ToolError` (the
/// real text is logged).
const FOREIGN_MESSAGE: &str = "the request failed; the details are in the server's log";

/// Whole seconds, rounded up: a client told "6" after a 6.5 s wait would come back early
/// and be refused again.
fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0))
}

/// The response `error` is answered with: the status of [`status_for`], a
/// `Retry-After` in whole seconds (rounded up) when the status is 429 or 503 and the
/// error carries a [`retry_after`](ToolError::retry_after), and the JSON body
/// `{"error": {"code": "CIRCUIT_OPEN", "message": "...", "retriable": false}}` with
/// `content-type: application/json`.
///
/// The message is the error's own, except for `INTERNAL` (a generic text; the real one is
/// logged), `OUTCOME_UNKNOWN` (a fixed text telling the client to check before
/// repeating) and an error made from another type than `ToolError`
/// ([`ToolError::is_foreign`]: a database driver's text may name hosts and credentials;
/// a generic text, the real one logged). `retriable` is [`ErrorKind::is_retriable`]: `false` for `CIRCUIT_OPEN`,
/// whose `Retry-After` says when to come back.
///
/// ```
/// use std::time::Duration;
/// use toolshield_axum::error_response;
/// use toolshield_core::ToolError;
///
/// let limited = ToolError::rate_limited("too many calls", Some(Duration::from_millis(6_500)));
/// let response = error_response(&limited);
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "7");
/// assert_eq!(response.headers()["content-type"], "application/json");
/// ```
pub fn error_response(error: &ToolError) -> Response {
    let kind = error.kind();
    let status = status_for(kind);
    if matches!(kind, ErrorKind::Internal | ErrorKind::OutcomeUnknown) || error.is_foreign() {
        tracing::error!(code = kind.code(), error = %error, "answering a request with {status}");
    }
    let body = ErrorBody {
        error: ToolResultError {
            code: kind.code().to_owned(),
            message: public_message(error).into_owned(),
            retriable: kind.is_retriable(),
        },
    };
    let mut response = (status, Json(body)).into_response();
    let waits =
        status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS;
    if let (true, Some(wait)) = (waits, error.retry_after()) {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(retry_after_secs(wait)),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::retry_after_secs;
    use std::time::Duration;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 0);
        assert_eq!(retry_after_secs(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(7)), 7);
        assert_eq!(retry_after_secs(Duration::from_millis(6_500)), 7);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }
}
