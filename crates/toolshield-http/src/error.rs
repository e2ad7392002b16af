//! Client errors into [`ToolError`]: the layer, and the mapping it uses.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::SystemTime;

use pin_project_lite::pin_project;
use toolshield_core::http_impls::RetryAfter;
use toolshield_core::{BoxError, ErrorKind, ToolError};
use tower_layer::Layer;
use tower_service::Service;

use crate::retry_after::parse_retry_after;

/// Maps an HTTP client's error to a [`ToolError`], keeping it as the source:
///
/// - a timeout anywhere in the source chain (an `io::ErrorKind::TimedOut`, a hyper
///   timeout, a tokio `Elapsed`) is `TIMEOUT`;
/// - a connect error of hyper-util's legacy client (nothing was sent) and I/O errors
///   such as a refused or reset connection are `CONNECTION_FAILED`;
/// - a [`ToolError`] passes through unchanged;
/// - anything else (the connection broke after the request was sent) is
///   `UPSTREAM_UNAVAILABLE`.
pub fn client_error(error: impl Into<BoxError>) -> ToolError {
    let error: BoxError = error.into();
    let error = match error.downcast::<ToolError>() {
        Ok(tool_error) => return *tool_error,
        Err(other) => other,
    };
    let kind = error_kind(&*error);
    let message = match kind {
        ErrorKind::Timeout => "http request timed out",
        ErrorKind::ConnectionFailed => "http connection failed",
        _ => "http request failed",
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

fn error_kind(error: &(dyn StdError + 'static)) -> ErrorKind {
    let mut connect = false;
    let mut io = false;
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(legacy) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            connect |= legacy.is_connect();
        } else if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_timeout() {
                return ErrorKind::Timeout;
            }
        } else if let Some(ioe) = e.downcast_ref::<std::io::Error>() {
            if ioe.kind() == std::io::ErrorKind::TimedOut {
                return ErrorKind::Timeout;
            }
            io = true;
        } else if e.is::<tokio::time::error::Elapsed>() {
            return ErrorKind::Timeout;
        }
        current = e.source();
    }
    if connect || io {
        ErrorKind::ConnectionFailed
    } else {
        ErrorKind::UpstreamUnavailable
    }
}

/// Wraps an HTTP client so its errors are [`ToolError`]s ([`client_error`]), and a
/// `Retry-After` HTTP date on a response is honoured (left as a [`RetryAfter`] extension).
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpErrorLayer;

impl HttpErrorLayer {
    /// The layer.
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
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = HttpErrorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(client_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        HttpErrorFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    /// The future of [`HttpErrors`].
    #[derive(Debug)]
    pub struct HttpErrorFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, B, E> Future for HttpErrorFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<B>, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut response = ready!(self.project().inner.poll(cx)).map_err(client_error)?;
        note_retry_after(&mut response);
        Poll::Ready(Ok(response))
    }
}

/// Leaves a `Retry-After` given as an HTTP date on the response as a [`RetryAfter`]
/// extension, so the retry layer honours both forms (core reads delta seconds itself).
fn note_retry_after<B>(response: &mut http::Response<B>) {
    let wait = match response.headers().get(http::header::RETRY_AFTER) {
        Some(v) if !v.as_bytes().iter().all(u8::is_ascii_digit) => {
            parse_retry_after(v, SystemTime::now())
        }
        _ => None,
    };
    if let Some(wait) = wait {
        response.extensions_mut().insert(RetryAfter(wait));
    }
}
