//! [`ToolErrorResponseLayer`]: the errors of the layers around a handler become HTTP
//! responses, so the stack fits `Router::route_layer` and `Router::layer`.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::response::{IntoResponse, Response};
use pin_project_lite::pin_project;
use toolshield_core::IntoToolError;
use toolshield_core::ToolError;
use tower_layer::Layer;
use tower_service::Service;

use crate::status::error_response;

/// Turns the errors of the service it wraps into responses: wraps a service in
/// [`ToolErrorResponse`].
///
/// The service it builds never fails (`Error = Infallible`) and answers with an
/// [`axum::response::Response`], which is what `Router::route_layer` and `Router::layer`
/// require. Put it outermost, above the toolshield layers that protect the handler; an
/// error becomes the response of [`error_response`](crate::error_response): a status from
/// [`status_for`](crate::status_for), `Retry-After` where it applies, and the JSON body
/// `{"error": {"code", "message", "retriable"}}`. A successful response, a handler's own
/// 4xx or 5xx included, passes through unchanged.
///
/// # Example
///
/// A breaker and a timeout on two routes; the client of an open breaker gets
/// `503` with `Retry-After`, the client of a handler that takes too long `504`.
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use tower::ServiceBuilder;
/// use toolshield_axum::{HandlerClassifier, MatchedPathKey, ToolErrorResponseLayer};
/// use toolshield_breaker::{BreakerConfig, BreakerLayer};
/// use toolshield_timeout::TimeoutLayer;
///
/// # fn main() -> Result<(), toolshield_core::ConfigError> {
/// let breaker = BreakerLayer::from_config(&BreakerConfig {
///     consecutive_failures: 5,
///     open_wait: Duration::from_secs(30),
///     ..BreakerConfig::default()
/// })?
/// .key_fn(MatchedPathKey) // one breaker per route
/// .classifier(HandlerClassifier); // 5xx and errors count; 4xx never do
///
/// let app: Router = Router::new()
///     .route("/search", get(|| async { "results" }))
///     .route("/report", get(|| async { "report" }))
///     .route_layer(
///         ServiceBuilder::new()
///             .layer(ToolErrorResponseLayer::new())
///             .layer(breaker)
///             .layer(TimeoutLayer::new(Duration::from_secs(2))),
///     );
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[must_use]
pub struct ToolErrorResponseLayer {
    _private: (),
}

impl ToolErrorResponseLayer {
    /// The layer. It has no settings: the mapping is [`status_for`](crate::status_for).
    pub const fn new() -> Self {
        ToolErrorResponseLayer { _private: () }
    }
}

impl<S> Layer<S> for ToolErrorResponseLayer {
    type Service = ToolErrorResponse<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ToolErrorResponse::new(inner)
    }
}

/// A service whose errors are answered as HTTP responses; built by
/// [`ToolErrorResponseLayer`].
///
/// Wraps any `Service<Req>` whose response is [`IntoResponse`] and whose error converts
/// into a [`ToolError`] (every toolshield layer's error is a `ToolError`). An error from the
/// inner service's `poll_ready` is kept and answered by the next `call`, which then does
/// not reach the inner service: readiness never fails, as `Error = Infallible` promises.
pub struct ToolErrorResponse<S> {
    inner: S,
    /// The error the inner `poll_ready` returned, answered by the next `call`.
    not_ready: Option<ToolError>,
}

impl<S> ToolErrorResponse<S> {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: S) -> Self {
        ToolErrorResponse {
            inner,
            not_ready: None,
        }
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

// By hand: a clone has not been polled ready, so it starts without a readiness error.
impl<S: Clone> Clone for ToolErrorResponse<S> {
    fn clone(&self) -> Self {
        ToolErrorResponse::new(self.inner.clone())
    }
}

impl<S: fmt::Debug> fmt::Debug for ToolErrorResponse<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolErrorResponse")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Service<Req> for ToolErrorResponse<S>
where
    S: Service<Req>,
    S::Response: IntoResponse,
    S::Error: IntoToolError,
{
    type Response = Response;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.not_ready.is_none() {
            if let Err(e) = ready!(self.inner.poll_ready(cx)) {
                self.not_ready = Some(e.into_tool_error());
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.not_ready.take() {
            Some(error) => ResponseFuture {
                state: State::NotReady { error: Some(error) },
            },
            None => ResponseFuture {
                state: State::Called {
                    future: self.inner.call(req),
                },
            },
        }
    }
}

pin_project! {
    /// The future of [`ToolErrorResponse`]: the inner response, or the response its error
    /// is answered with.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F },
        NotReady { error: Option<ToolError> },
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<R, E>>,
    R: IntoResponse,
    E: IntoToolError,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = match self.project().state.project() {
            StateProj::Called { future } => match ready!(future.poll(cx)) {
                Ok(response) => response.into_response(),
                Err(e) => error_response(&e.into_tool_error()),
            },
            // Polled again after it finished: a contract breach by the caller, answered
            // rather than panicking on the request path.
            StateProj::NotReady { error } => match error.take() {
                Some(error) => error_response(&error),
                None => error_response(&ToolError::internal(
                    "response future polled after completion",
                )),
            },
        };
        Poll::Ready(Ok(response))
    }
}
