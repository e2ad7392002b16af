use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use toolshield_contract::time;
use toolshield_contract::IntoToolError;
use toolshield_contract::{ErrorKind, ShieldRequest, ToolError};
use tower_service::Service;

use crate::gate::{Permit, QueuePlace};
use crate::layer::Shared;

pub(crate) type Wait = Pin<Box<dyn Future<Output = Option<Permit>> + Send>>;

pin_project! {
    /// The future of [`Bulkhead`](crate::Bulkhead): the inner call holding its slot, a
    /// call waiting in the queue, or a rejection.
    pub struct ResponseFuture<F, S, Req> {
        #[pin]
        state: State<F, S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, Req> {
        Running {
            #[pin]
            fut: F,
            // Dropped with the state: when the call ends or this future is dropped.
            permit: Permit,
        },
        Queued {
            wait: Wait,
            place: Option<QueuePlace>,
            #[pin]
            sleep: Sleep,
            // The call's attempt token: a cancelled waiter leaves the queue at once.
            #[pin]
            cancelled: Option<WaitForCancellationFutureOwned>,
            svc: Option<S>,
            req: Option<Req>,
            started: Instant,
            shared: Arc<Shared>,
        },
        Failed {
            error: Option<ToolError>,
        },
        Done,
    }
}

impl<F, S, Req> ResponseFuture<F, S, Req> {
    pub(crate) fn running(fut: F, permit: Permit) -> Self {
        ResponseFuture {
            state: State::Running { fut, permit },
        }
    }

    /// `wait` is `place`'s wait, already polled once (it holds its place in line);
    /// `token`, when the request has one, ends the wait with `CANCELLED`.
    pub(crate) fn queued(
        place: QueuePlace,
        wait: Wait,
        until: Instant,
        token: Option<CancellationToken>,
        svc: S,
        req: Req,
        shared: Arc<Shared>,
    ) -> Self {
        ResponseFuture {
            state: State::Queued {
                wait,
                place: Some(place),
                sleep: sleep_until(until),
                cancelled: token.map(CancellationToken::cancelled_owned),
                svc: Some(svc),
                req: Some(req),
                started: time::now(),
                shared,
            },
        }
    }

    pub(crate) fn failed(error: ToolError) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<F, S, Req> std::fmt::Debug for ResponseFuture<F, S, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Running { .. } => "running",
            State::Queued { .. } => "queued",
            State::Failed { .. } => "failed",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

pub(crate) fn cancelled_while_queued() -> ToolError {
    ToolError::cancelled("call cancelled while waiting for a bulkhead slot")
}

fn polled_after_completion() -> ToolError {
    ToolError::internal("bulkhead future polled after completion")
}

impl<F, S, Req, E> Future for ResponseFuture<F, S, Req>
where
    S: Service<Req, Future = F>,
    F: Future<Output = Result<S::Response, E>>,
    E: IntoToolError,
    Req: ShieldRequest,
{
    type Output = Result<S::Response, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Running { fut, .. } => {
                    let out = std::task::ready!(fut.poll(cx));
                    // Frees the slot now, not when the caller drops this future.
                    this.state.set(State::Done);
                    return Poll::Ready(out.map_err(IntoToolError::into_tool_error));
                }
                StateProj::Queued {
                    wait,
                    place,
                    sleep,
                    cancelled,
                    svc,
                    req,
                    started,
                    shared,
                } => {
                    if let Some(cancelled) = cancelled.as_pin_mut() {
                        if cancelled.poll(cx).is_ready() {
                            // Leaves the queue now (a slot already handed to this wait
                            // goes back to the semaphore, to the next in line); the
                            // cancelled call never runs. Not a rejection.
                            this.state.set(State::Done);
                            return Poll::Ready(Err(cancelled_while_queued()));
                        }
                    }
                    if let Poll::Ready(permit) = wait.as_mut().poll(cx) {
                        drop(place.take());
                        let (Some(permit), Some(mut svc), Some(req)) =
                            (permit, svc.take(), req.take())
                        else {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(polled_after_completion()));
                        };
                        let fut = svc.call(req);
                        this.state.set(State::Running { fut, permit });
                        continue;
                    }
                    std::task::ready!(sleep.poll(cx));
                    shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
                    let waited = time::now().saturating_duration_since(*started);
                    let message = match req.as_ref().and_then(ShieldRequest::call_name) {
                        Some(n) => format!(
                            "bulkhead full for `{n}`: no slot freed within {waited:?} in the queue"
                        ),
                        None => {
                            format!("bulkhead full: no slot freed within {waited:?} in the queue")
                        }
                    };
                    // Leaves the queue and drops the carried service and request now.
                    this.state.set(State::Done);
                    return Poll::Ready(Err(ToolError::new(ErrorKind::Overloaded, message)));
                }
                StateProj::Failed { error } => {
                    let e = error.take().unwrap_or_else(polled_after_completion);
                    this.state.set(State::Done);
                    return Poll::Ready(Err(e));
                }
                StateProj::Done => return Poll::Ready(Err(polled_after_completion())),
            }
        }
    }
}
