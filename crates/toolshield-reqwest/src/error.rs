//! reqwest's errors and HTTP error statuses as [`ToolError`]s.

use std::error::Error as StdError;
use std::time::SystemTime;

use toolshield_core::http_impls::{http_status_kind, RetryAfter};
use toolshield_core::{CallKind, ErrorKind, ToolError};
use toolshield_http::retry_after_from_headers;

/// Maps a [`reqwest::Error`] to a [`ToolError`] for a call of `kind`, with the rules of
/// `toolshield_http::client_error_for`:
///
/// | reqwest says | kind | retried | breaker |
/// |---|---|---|---|
/// | an `https://` URL and a reqwest built without a TLS backend | `INVALID_INPUT` | no | no |
/// | [`is_connect`](reqwest::Error::is_connect) (refused, DNS, TLS handshake, connect timeout: nothing was sent) | `CONNECTION_FAILED` | yes | counts |
/// | [`is_timeout`](reqwest::Error::is_timeout) (reqwest's own timeouts, an I/O or hyper timeout) | `TIMEOUT` | yes | counts |
/// | [`is_builder`](reqwest::Error::is_builder) (a URL reqwest cannot send to) | `INVALID_INPUT` | no | no |
/// | [`is_redirect`](reqwest::Error::is_redirect) (a loop, too many redirects), not [`Mutating`](CallKind::Mutating) | `EXECUTION_FAILED` | no | counts |
/// | anything else (reset or closed after sending, a body cut off, a decode or redirect error), [`Mutating`](CallKind::Mutating) call | `OUTCOME_UNKNOWN` | no | no |
/// | the same, any other call | `UPSTREAM_UNAVAILABLE` | yes | counts |
///
/// The reqwest error is kept as the [`source`](std::error::Error::source), with the query,
/// fragment and credentials of its URL removed (they may hold secrets); the message
/// is short and says nothing of the URL.
pub fn reqwest_error_for(kind: CallKind, error: reqwest::Error) -> ToolError {
    let (code, message) = if needs_tls(&error) {
        (
            ErrorKind::InvalidInput,
            "https needs a tls backend: enable reqwest's `rustls-tls` or `native-tls` feature",
        )
    } else if error.is_connect() {
        // Before the timeout check: a connect that timed out sent nothing.
        (ErrorKind::ConnectionFailed, "http connection failed")
    } else if error.is_timeout() {
        (ErrorKind::Timeout, "http request timed out")
    } else if error.is_builder() {
        (ErrorKind::InvalidInput, "invalid http request")
    } else if kind == CallKind::Mutating {
        // Whatever went wrong, the request (or its first hop) may have been executed.
        (
            ErrorKind::OutcomeUnknown,
            "http connection lost after the request was sent",
        )
    } else if error.is_redirect() {
        // A redirect loop does not fix itself on the next attempt.
        (ErrorKind::ExecutionFailed, "http redirects did not end")
    } else {
        (ErrorKind::UpstreamUnavailable, "http request failed")
    };
    ToolError::new(code, message).with_source(redact(error))
}

/// Whether hyper-util's plain-HTTP connector refused an `https://` URL: what reqwest
/// does when it was built without a TLS backend. Retrying or counting that against the
/// host would be wrong: it is the program's configuration. The connector's error has no
/// kind to test, so its fixed message is compared (on the error path only).
fn needs_tls(error: &reqwest::Error) -> bool {
    let mut source = StdError::source(error);
    while let Some(e) = source {
        if e.to_string() == "invalid URL, scheme is not http" {
            return true;
        }
        source = e.source();
    }
    false
}

/// Removes what a URL may carry as secrets (`?api_key=`, `user:password@`).
fn redact(mut error: reqwest::Error) -> reqwest::Error {
    if let Some(url) = error.url_mut() {
        url.set_query(None);
        url.set_fragment(None);
        // Fails only for URLs that cannot have credentials: nothing to remove then.
        let _ = url.set_username("");
        let _ = url.set_password(None);
    }
    error
}

/// Turns a response whose status is an error into a [`ToolError`], as reqwest's own
/// `error_for_status` does, with the HTTP rules of the stack: 429 `RATE_LIMITED` and
/// 408/425/502/503/504 `UPSTREAM_UNAVAILABLE` (both with their `Retry-After`, delta
/// seconds or HTTP date, the longest of several), other 5xx `EXECUTION_FAILED`, 401/403 `UNAUTHORIZED`, 404
/// `NOT_FOUND`, other 4xx `INVALID_INPUT`. 1xx, 2xx and 3xx responses are returned
/// unchanged.
///
/// The layers classify statuses without it; call it last, where the caller (or the
/// model, through [`ToolError::for_model`]) wants an error rather than a response: for
/// the 429 the retry layer gave back because its `Retry-After` was too long to wait.
///
/// ```
/// use bytes::Bytes;
/// use std::time::Duration;
/// use toolshield_core::ErrorKind;
///
/// let res = http::Response::builder()
///     .status(429)
///     .header("retry-after", "120")
///     .body(Bytes::new())
///     .unwrap();
/// let err = toolshield_reqwest::error_for_status(res).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::RateLimited);
/// assert_eq!(err.retry_after(), Some(Duration::from_secs(120)));
/// ```
pub fn error_for_status<B>(response: http::Response<B>) -> Result<http::Response<B>, ToolError> {
    let status = response.status();
    let Some(kind) = http_status_kind(status) else {
        return Ok(response);
    };
    let mut error = ToolError::new(kind, format!("http {status}"));
    if matches!(
        kind,
        ErrorKind::RateLimited | ErrorKind::UpstreamUnavailable
    ) {
        let wait = response
            .extensions()
            .get::<RetryAfter>()
            .map(|r| r.0)
            .or_else(|| retry_after_from_headers(response.headers(), SystemTime::now()));
        if let Some(wait) = wait {
            error = error.with_retry_after(wait);
        }
    }
    Err(error)
}
