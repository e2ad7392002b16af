//! Client errors into [`ToolError`]: the layer, and the mapping it uses.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::SystemTime;

use pin_project_lite::pin_project;
use toolshield_core::http_impls::RetryAfter;
use toolshield_core::{BoxError, CallKind, ErrorKind, ShieldRequest, ToolError};
use tower_layer::Layer;
use tower_service::Service;

use crate::retry_after::retry_after_from_headers;

/// Maps an HTTP client's error to a [`ToolError`] for a call that is safe to repeat
/// (`ReadOnly` or `Idempotent`), keeping it as the source. Same as
/// [`client_error_for`] with [`CallKind::Idempotent`].
pub fn client_error(error: impl Into<BoxError>) -> ToolError {
    client_error_for(CallKind::Idempotent, error)
}

/// Maps an HTTP client's error to a [`ToolError`] for a call of `kind`, keeping it as
/// the source:
///
/// - the connector refused the URL before connecting (hyper-util's `HttpConnector`
///   given an `https://` URL without TLS, or a URL without a scheme or host):
///   `INVALID_INPUT`, neither retried nor counted;
/// - failed before anything was sent (a connect error of hyper-util's legacy client:
///   refused, DNS, TLS handshake, connect timeout; an I/O `ConnectionRefused`):
///   `CONNECTION_FAILED`, retriable;
/// - a timeout anywhere else in the source chain (an `io::ErrorKind::TimedOut`, a hyper
///   timeout, tokio's or tower's `Elapsed`): `TIMEOUT`;
/// - anything else may have happened after the request left (reset, closed, EOF before
///   the answer): `OUTCOME_UNKNOWN` for a [`Mutating`](CallKind::Mutating) call (never
///   retried; the idempotency layer keeps the key), `UPSTREAM_UNAVAILABLE` (retriable)
///   otherwise;
/// - a [`ToolError`] passes through unchanged.
pub fn client_error_for(kind: CallKind, error: impl Into<BoxError>) -> ToolError {
    let error: BoxError = error.into();
    let error = match error.downcast::<ToolError>() {
        Ok(tool_error) => return *tool_error,
        Err(other) => other,
    };
    let (kind, message) = match stage(&*error) {
        Stage::Unsendable => (
            ErrorKind::InvalidInput,
            "the http client cannot send to this url (an `https://` url needs a client with tls)",
        ),
        Stage::NotSent => (ErrorKind::ConnectionFailed, "http connection failed"),
        Stage::TimedOut => (ErrorKind::Timeout, "http request timed out"),
        Stage::MaybeSent if kind == CallKind::Mutating => (
            ErrorKind::OutcomeUnknown,
            "http connection lost after the request was sent",
        ),
        Stage::MaybeSent => (ErrorKind::UpstreamUnavailable, "http request failed"),
    };
    ToolError::new(kind, message).with_source(BoxedSource(error))
}

/// A boxed error as a sized error type, so it can be a [`ToolError`] source.
#[derive(Debug)]
struct BoxedSource(BoxError);

impl std::fmt::Display for BoxedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for BoxedSource {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// How far a failed request got.
enum Stage {
    /// The connector refused the URL itself (a scheme it does not speak, such as
    /// `https://` without TLS): nothing was sent, and no attempt ever will be.
    Unsendable,
    /// Nothing left this process: safe to send again.
    NotSent,
    /// A timeout after the connection was made.
    TimedOut,
    /// The request may have reached the server.
    MaybeSent,
}

fn stage(error: &(dyn StdError + 'static)) -> Stage {
    let mut timed_out = false;
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(legacy) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            // The legacy client's connect errors happen before a byte of the request
            // is written (DNS, refused, TLS handshake, connect timeout).
            if legacy.is_connect() {
                return if refused_url(legacy) {
                    Stage::Unsendable
                } else {
                    Stage::NotSent
                };
            }
        } else if let Some(h) = e.downcast_ref::<hyper::Error>() {
            timed_out |= h.is_timeout();
        } else if let Some(ioe) = e.downcast_ref::<std::io::Error>() {
            match ioe.kind() {
                // Only a connect can be refused; a connection that was open is reset.
                std::io::ErrorKind::ConnectionRefused => return Stage::NotSent,
                std::io::ErrorKind::TimedOut => timed_out = true,
                _ => {}
            }
        } else if e.is::<tokio::time::error::Elapsed>() || e.is::<tower::timeout::error::Elapsed>()
        {
            timed_out = true;
        }
        current = e.source();
    }
    if timed_out {
        Stage::TimedOut
    } else {
        Stage::MaybeSent
    }
}

/// What hyper-util's `HttpConnector` says when it refuses a URL before connecting (its
/// error type is private, so its fixed messages are compared, on the error path only).
const REFUSED_URL: [&str; 3] = [
    "invalid URL, scheme is not http",
    "invalid URL, scheme is missing",
    "invalid URL, host is missing",
];

/// Whether a connect error is the connector refusing the URL (a configuration or input
/// problem: retrying it, or counting it against the host, would be wrong).
fn refused_url(error: &(dyn StdError + 'static)) -> bool {
    let mut current = error.source();
    while let Some(e) = current {
        let text = e.to_string();
        if REFUSED_URL.contains(&text.as_str()) {
            return true;
        }
        current = e.source();
    }
    false
}

/// Wraps an HTTP client so its errors are [`ToolError`]s ([`client_error_for`] with the
/// request's [`CallKind`]: a `POST` whose connection is lost after sending is
/// `OUTCOME_UNKNOWN`, a `GET` `UPSTREAM_UNAVAILABLE`), and a response's `Retry-After`
/// (an HTTP date too; the longest of several) is left as a [`RetryAfter`] extension,
/// which the retry layer honours.
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpErrorLayer;

impl HttpErrorLayer {
    /// The layer.
    #[must_use]
    pub fn new() -> Self {
        HttpErrorLayer
    }
}

impl<S> Layer<S> for HttpErrorLayer {
    type Service = HttpErrors<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpErrors { inner }
    }
}

/// The service of [`HttpErrorLayer`].
#[derive(Debug, Clone)]
pub struct HttpErrors<S> {
    inner: S,
}

impl<S> HttpErrors<S> {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: S) -> Self {
        HttpErrors { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req, B> Service<Req> for HttpErrors<S>
where
    S: Service<Req, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = HttpErrorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(client_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // The kind decides what a connection lost after sending becomes.
        let kind = req.call_kind().unwrap_or_default();
        HttpErrorFuture {
            inner: self.inner.call(req),
            kind,
        }
    }
}

pin_project! {
    /// The future of [`HttpErrors`].
    #[derive(Debug)]
    pub struct HttpErrorFuture<F> {
        #[pin]
        inner: F,
        kind: CallKind,
    }
}

impl<F, B, E> Future for HttpErrorFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<B>, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let kind = *this.kind;
        let mut response = ready!(this.inner.poll(cx)).map_err(|e| client_error_for(kind, e))?;
        note_retry_after(&mut response);
        Poll::Ready(Ok(response))
    }
}

/// Leaves the response's `Retry-After` as a [`RetryAfter`] extension, so the retry layer
/// honours both forms (core reads delta seconds only) and, when the response carries
/// several, the longest ([`retry_after_from_headers`]), never just the first.
fn note_retry_after<B>(response: &mut http::Response<B>) {
    if let Some(wait) = retry_after_from_headers(response.headers(), SystemTime::now()) {
        response.extensions_mut().insert(RetryAfter(wait));
    }
}
