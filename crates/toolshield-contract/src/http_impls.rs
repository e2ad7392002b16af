//! [`ShieldRequest`] for `http::Request<B>` and [`ShieldResponse`] for `http::Response<B>`,
//! so the generic layers (timeout, cancel, retry, breaker, metrics) wrap HTTP clients.
//!
//! The per-call state an HTTP request has no field for (cancellation tokens, deadline,
//! attempt number, an explicit [`CallKind`]) lives in one [`CallState`] in the request's
//! extensions, created on first write. The rest is read from the request itself:
//!
//! - the name ([`ShieldRequest::call_name`]) is the URI host, or the [`HttpRoute`] extension
//!   when one is set (a route template such as `GET /users/{id}`);
//! - the [`CallKind`] follows the method ([`http_method_kind`]) unless the state says
//!   otherwise;
//! - the idempotency key is the `Idempotency-Key` header (IETF draft); a blank value, or
//!   two different values, is no key;
//! - the caller, trace and run ids ([`ShieldRequest::call_meta`]) are those of a
//!   [`CallIds`] extension the application inserts, none without one (never read from
//!   headers: a caller could name its own run and escape its budget).
//!
//! Responses: 429 is `RATE_LIMITED` with its `Retry-After`, 408/425/502/503/504
//! `UPSTREAM_UNAVAILABLE`, other 5xx `EXECUTION_FAILED`, 401/403 `UNAUTHORIZED`, 404
//! `NOT_FOUND`, other 4xx `INVALID_INPUT` ([`http_status_kind`]).

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};

use crate::{
    CallIds, CallKind, CallMeta, CallState, ErrorKind, InBandFailure, ShieldRequest,
    ShieldResponse, SlowCall,
};

/// The `Idempotency-Key` header name (IETF draft `httpapi-idempotency-key-header`).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// A route template that keys breakers and metrics instead of the host: insert it in
/// the request's extensions (`req.extensions_mut().insert(HttpRoute::new("GET /users/{id}"))`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRoute(Arc<str>);

impl HttpRoute {
    /// A route template.
    #[must_use]
    pub fn new(route: impl Into<Arc<str>>) -> Self {
        HttpRoute(route.into())
    }

    /// The template.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The number of attempts the retry layer made, left on an HTTP response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpAttempts(pub u32);

/// The side-effect class of an HTTP method: GET, HEAD, PUT, DELETE, OPTIONS and TRACE
/// are [`Idempotent`](CallKind::Idempotent) (RFC 9110 §9.2.2); everything else (POST,
/// PATCH, extension methods) is [`Mutating`](CallKind::Mutating).
pub fn http_method_kind(method: &Method) -> CallKind {
    match *method {
        Method::GET
        | Method::HEAD
        | Method::PUT
        | Method::DELETE
        | Method::OPTIONS
        | Method::TRACE => CallKind::Idempotent,
        _ => CallKind::Mutating,
    }
}

/// The error kind of a non-success HTTP status, `None` for 1xx, 2xx and 3xx: 429
/// `RATE_LIMITED`; 408, 425, 502, 503, 504 `UPSTREAM_UNAVAILABLE` (retriable, with their
/// `Retry-After`); 401/403 `UNAUTHORIZED`; 404 `NOT_FOUND`; other 4xx `INVALID_INPUT`;
/// other 5xx `EXECUTION_FAILED`, and so is a status outside 100..=599 (600..=999), which
/// RFC 9110 (section 15) says a client should treat as a 5xx.
pub fn http_status_kind(status: StatusCode) -> Option<ErrorKind> {
    match status.as_u16() {
        429 => Some(ErrorKind::RateLimited),
        // 408 Request Timeout and 425 Too Early say "not now", not "wrong arguments".
        408 | 425 | 502..=504 => Some(ErrorKind::UpstreamUnavailable),
        401 | 403 => Some(ErrorKind::Unauthorized),
        404 => Some(ErrorKind::NotFound),
        400..=499 => Some(ErrorKind::InvalidInput),
        100..=399 => None,
        _ => Some(ErrorKind::ExecutionFailed),
    }
}

/// Parses a `Retry-After` value given as delta seconds. HTTP dates are parsed by
/// `toolshield-http`'s `parse_retry_after`; this minimal form keeps core free of a date
/// parser. Returns `None` for anything else.
fn retry_after_seconds(value: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // All digits: a number too large for u64 is "very long", cut to the longest wait.
    let secs = text.parse::<u64>().unwrap_or(u64::MAX);
    Some(Duration::from_secs(secs).min(crate::config::MAX_DURATION))
}

/// A parsed `Retry-After` the client left on a response (in its extensions), so an
/// HTTP-date form is honoured too: `toolshield-http` inserts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter(pub Duration);

impl<B> ShieldRequest for http::Request<B> {
    fn call_state(&self) -> Option<&CallState> {
        self.extensions().get::<CallState>()
    }

    fn call_state_mut(&mut self) -> Option<&mut CallState> {
        Some(self.extensions_mut().get_or_insert_with(CallState::new))
    }

    fn call_name(&self) -> Option<&str> {
        if let Some(route) = self.extensions().get::<HttpRoute>() {
            return Some(route.as_str());
        }
        Some(self.uri().host().unwrap_or("http"))
    }

    fn call_kind(&self) -> Option<CallKind> {
        Some(
            self.call_state()
                .and_then(CallState::kind)
                .unwrap_or_else(|| http_method_kind(self.method())),
        )
    }

    fn call_meta(&self) -> CallMeta<'_> {
        self.extensions()
            .get::<CallIds>()
            .map(CallIds::meta)
            .unwrap_or_default()
    }

    fn call_idempotency_key(&self) -> Option<&str> {
        // Blank is no key; two different values are no key either (which one would the
        // server dedupe on?), so such a request is never repeated.
        let mut values = self
            .headers()
            .get_all(IDEMPOTENCY_KEY_HEADER)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter(|k| !k.trim().is_empty());
        let key = values.next()?;
        values.all(|other| other == key).then_some(key)
    }
}

impl<B> ShieldResponse for http::Response<B> {
    fn in_band_failure(&self) -> Option<InBandFailure> {
        let kind = http_status_kind(self.status())?;
        let retry_after =
            if kind == ErrorKind::RateLimited || kind == ErrorKind::UpstreamUnavailable {
                self.extensions()
                    .get::<RetryAfter>()
                    .map(|r| r.0)
                    .or_else(|| {
                        // The longest of several lines that parse: no wait the server
                        // sent is cut short.
                        self.headers()
                            .get_all(http::header::RETRY_AFTER)
                            .iter()
                            .filter_map(|v| retry_after_seconds(v.as_bytes()))
                            .max()
                    })
            } else {
                None
            };
        Some(InBandFailure { kind, retry_after })
    }

    fn mark_slow(&mut self, slow: SlowCall) {
        self.extensions_mut().insert(slow);
    }

    fn slow_call(&self) -> Option<SlowCall> {
        self.extensions().get::<SlowCall>().copied()
    }

    fn set_attempts(&mut self, attempts: u32) {
        self.extensions_mut().insert(HttpAttempts(attempts));
    }
}

#[cfg(test)]
mod tests {
    use super::retry_after_seconds;
    use crate::config::MAX_DURATION;
    use std::time::Duration;

    #[test]
    fn a_retry_after_beyond_the_longest_duration_is_cut_to_it() {
        assert_eq!(retry_after_seconds(b"7"), Some(Duration::from_secs(7)));
        assert_eq!(retry_after_seconds(b"99999999999999"), Some(MAX_DURATION));
        // More digits than a u64 holds: still "very long", never a parse failure.
        assert_eq!(
            retry_after_seconds(b"999999999999999999999999"),
            Some(MAX_DURATION)
        );
        assert_eq!(retry_after_seconds(b"-1"), None);
    }
}
