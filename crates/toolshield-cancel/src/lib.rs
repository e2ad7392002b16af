//! Cancellation for tool calls.
//!
//! [`CancelLayer`] checks the request's call token before anything runs and races it
//! against everything inside: if the token is already cancelled the inner service is
//! never called; if it fires during the call the inner future is dropped at once and the
//! call fails with `CANCELLED`. The default classifier reports `CANCELLED` as
//! [`Outcome::Cancelled`](toolshield_contract::Outcome::Cancelled), so no breaker counts it
//! and no retry repeats it.
//!
//! In the default stack it sits just inside metrics and provenance, outside the deadline,
//! so a cancelled call stops retries, backoff waits and the tool alike:
//!
//! ```text
//! metrics > provenance > CANCEL > deadline > validate > cache > idempotency > fallback
//!         > retry > breaker > attempt timeout > tool
//! ```
//!
//! The tool itself sees a child of the call token
//! ([`ToolRequest::attempt_token`](toolshield_contract::ToolRequest::attempt_token)), which
//! fires with it.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use serde_json::json;
//! use tokio_util::sync::CancellationToken;
//! use tower::{service_fn, Layer, ServiceExt};
//! use toolshield_cancel::CancelLayer;
//! use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let tool = service_fn(|_req: ToolRequest| async {
//!     tokio::time::sleep(Duration::from_secs(60)).await;
//!     Ok::<_, ToolError>(ToolResponse::new(json!("done")))
//! });
//! let svc = CancelLayer::new().layer(tool);
//!
//! let token = CancellationToken::new();
//! let req = ToolRequest::new("search", json!({"q": "rust"})).cancel_token(token.clone());
//! let call = tokio::spawn(svc.oneshot(req));
//! tokio::time::sleep(Duration::from_secs(1)).await;
//! token.cancel();
//! assert_eq!(call.await.unwrap().unwrap_err().kind(), ErrorKind::Cancelled);
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio_util::sync::WaitForCancellationFutureOwned;
use toolshield_contract::{CallTokens, ShieldRequest, ToolError};
use tower_layer::Layer;
use tower_service::Service;

/// Applies [`Cancel`] to a service. Has no configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct CancelLayer {
    _priv: (),
}

impl CancelLayer {
    /// A new cancellation layer.
    pub fn new() -> Self {
        CancelLayer { _priv: () }
    }
}

impl<S> Layer<S> for CancelLayer {
    type Service = Cancel<S>;

    fn layer(&self, inner: S) -> Cancel<S> {
        Cancel::new(inner)
    }
}

/// Checks the call token before calling the inner service and races it against the call.
#[derive(Debug, Clone)]
pub struct Cancel<S> {
    inner: S,
}

impl<S> Cancel<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Cancel { inner }
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

fn cancelled_error(before: bool) -> ToolError {
    if before {
        ToolError::cancelled("call cancelled before it started")
    } else {
        ToolError::cancelled("call cancelled")
    }
}

impl<S, Req> Service<Req> for Cancel<S>
where
    S: Service<Req>,
    S::Error: Into<ToolError>,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let state = match req.call_state().map(|s| s.tokens().clone()) {
            Some(tokens) if tokens.call().is_cancelled() => State::Rejected,
            Some(tokens) => State::Racing {
                inner: self.inner.call(req),
                tokens,
                waiter: Waiter::Idle,
            },
            None => State::Plain {
                inner: self.inner.call(req),
            },
        };
        ResponseFuture { state }
    }
}

pin_project! {
    /// The future of [`Cancel`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Racing {
            #[pin]
            inner: F,
            tokens: CallTokens,
            #[pin]
            waiter: Waiter,
        },
        Plain {
            #[pin]
            inner: F,
        },
        Rejected,
        Done,
    }
}

pin_project! {
    // Registering with the token takes a lock, so it happens only once the inner future
    // has said it is pending: a call that finishes at once never pays for it.
    #[project = WaiterProj]
    enum Waiter {
        Idle,
        Waiting {
            #[pin]
            cancelled: WaitForCancellationFutureOwned,
        },
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, Res, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<ToolError>,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let out = match this.state.as_mut().project() {
            StateProj::Racing {
                inner,
                tokens,
                mut waiter,
            } => {
                // The call wins a tie: a result that is already there is worth more than
                // an error.
                if let Poll::Ready(result) = inner.poll(cx) {
                    result.map_err(Into::into)
                } else {
                    if let WaiterProj::Idle = waiter.as_mut().project() {
                        waiter.set(Waiter::Waiting {
                            cancelled: tokens.call().clone().cancelled_owned(),
                        });
                    }
                    let fired = match waiter.project() {
                        WaiterProj::Waiting { cancelled } => cancelled.poll(cx).is_ready(),
                        WaiterProj::Idle => false,
                    };
                    if !fired {
                        return Poll::Pending;
                    }
                    Err(cancelled_error(false))
                }
            }
            StateProj::Plain { inner } => match inner.poll(cx) {
                Poll::Ready(result) => result.map_err(Into::into),
                Poll::Pending => return Poll::Pending,
            },
            StateProj::Rejected => Err(cancelled_error(true)),
            StateProj::Done => Err(ToolError::internal("cancel future polled after completion")),
        };
        // Drops the inner future at once, whatever the outcome.
        this.state.set(State::Done);
        Poll::Ready(out)
    }
}
