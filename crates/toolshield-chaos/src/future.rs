use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use toolshield_contract::config::deadline_after;
use toolshield_contract::IntoToolError;
use toolshield_contract::{time, ToolError};
use tower_service::Service;

pin_project! {
    /// The future of [`Chaos`](crate::Chaos).
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Calling {
            #[pin]
            fut: S::Future,
        },
        Delaying {
            #[pin]
            sleep: Sleep,
            // Ends the wait with `CANCELLED`: the attempt token (a child of the call's).
            #[pin]
            cancelled: Option<WaitForCancellationFutureOwned>,
            // The wait was cut short by the request's deadline: `TIMEOUT`, no call.
            cut_by_deadline: bool,
            svc: Option<S>,
            req: Option<Req>,
        },
        Ready {
            out: Option<Result<S::Response, ToolError>>,
        },
        Hanging {
            #[pin]
            cancelled: Option<WaitForCancellationFutureOwned>,
        },
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    pub(crate) fn call(fut: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling { fut },
        }
    }

    /// Waits `delay`, but no longer than until `deadline` (then `TIMEOUT`) nor past a
    /// cancellation of `token` (then `CANCELLED`), and then calls `svc`.
    pub(crate) fn delayed(
        delay: Duration,
        deadline: Option<Instant>,
        token: Option<CancellationToken>,
        svc: S,
        req: Req,
    ) -> Self {
        let mut until = deadline_after(time::now(), delay);
        let mut cut_by_deadline = false;
        if let Some(deadline) = deadline {
            if deadline < until {
                until = deadline;
                cut_by_deadline = true;
            }
        }
        ResponseFuture {
            state: State::Delaying {
                sleep: sleep_until(until),
                cancelled: token.map(CancellationToken::cancelled_owned),
                cut_by_deadline,
                svc: Some(svc),
                req: Some(req),
            },
        }
    }

    pub(crate) fn ready(out: Result<S::Response, ToolError>) -> Self {
        ResponseFuture {
            state: State::Ready { out: Some(out) },
        }
    }

    pub(crate) fn hang(token: Option<CancellationToken>) -> Self {
        ResponseFuture {
            state: State::Hanging {
                cancelled: token.map(CancellationToken::cancelled_owned),
            },
        }
    }
}

impl<S, Req> std::fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: IntoToolError,
{
    type Output = Result<S::Response, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { fut } => {
                    return fut.poll(cx).map_err(IntoToolError::into_tool_error);
                }
                StateProj::Delaying {
                    sleep,
                    cancelled,
                    cut_by_deadline,
                    svc,
                    req,
                } => {
                    if let Some(cancelled) = cancelled.as_pin_mut() {
                        if cancelled.poll(cx).is_ready() {
                            // The carried service and request are dropped with the state.
                            this.state.set(State::Ready { out: None });
                            return Poll::Ready(Err(ToolError::cancelled(
                                "attempt cancelled during an injected delay",
                            )));
                        }
                    }
                    ready!(sleep.poll(cx));
                    if *cut_by_deadline {
                        this.state.set(State::Ready { out: None });
                        return Poll::Ready(Err(ToolError::timeout(
                            "call reached its deadline during an injected delay",
                        )));
                    }
                    let (Some(mut svc), Some(req)) = (svc.take(), req.take()) else {
                        return Poll::Ready(Err(ToolError::internal(
                            "fault injection future polled after completion",
                        )));
                    };
                    let fut = svc.call(req);
                    this.state.set(State::Calling { fut });
                }
                StateProj::Ready { out } => {
                    return Poll::Ready(out.take().unwrap_or_else(|| {
                        Err(ToolError::internal(
                            "fault injection future polled after completion",
                        ))
                    }));
                }
                StateProj::Hanging { cancelled } => {
                    let Some(cancelled) = cancelled.as_pin_mut() else {
                        return Poll::Pending;
                    };
                    ready!(cancelled.poll(cx));
                    return Poll::Ready(Err(ToolError::cancelled(
                        "attempt cancelled during an injected hang",
                    )));
                }
            }
        }
    }
}
