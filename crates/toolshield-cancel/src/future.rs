//! [`ResponseFuture`]: the future of [`Cancel`](crate::Cancel).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio_util::sync::WaitForCancellationFutureOwned;
use toolshield_contract::IntoToolError;
use toolshield_contract::{CallTokens, ErrorKind, ToolError};

fn cancelled_error(before: bool) -> ToolError {
    if before {
        ToolError::cancelled("call cancelled before it started")
    } else {
        ToolError::cancelled("call cancelled")
    }
}

/// The error of a call that failed: `CANCELLED` if its caller cancelled it by then.
/// Only on the error path.
fn cancelled_failure(error: ToolError, tokens: &CallTokens) -> ToolError {
    if error.kind() != ErrorKind::Cancelled && tokens.call().is_cancelled() {
        cancelled_error(false).with_source(error)
    } else {
        error
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

impl<F> ResponseFuture<F> {
    /// The token was cancelled before the call: the inner service is never called.
    pub(crate) fn rejected() -> Self {
        ResponseFuture {
            state: State::Rejected,
        }
    }

    /// Races `inner` against the call token.
    pub(crate) fn racing(inner: F, tokens: CallTokens) -> Self {
        ResponseFuture {
            state: State::Racing {
                inner,
                tokens,
                waiter: Waiter::Idle,
            },
        }
    }

    /// A request without call state: nothing to race against.
    pub(crate) fn plain(inner: F) -> Self {
        ResponseFuture {
            state: State::Plain { inner },
        }
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
    E: IntoToolError,
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
                // an error. A failure once the caller cancelled is the cancellation's
                // doing (a tool that gave up when its token fired): it ends `CANCELLED`,
                // the tool's error kept as the source.
                if let Poll::Ready(result) = inner.poll(cx) {
                    result.map_err(|e| cancelled_failure(e.into_tool_error(), tokens))
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
                Poll::Ready(result) => result.map_err(IntoToolError::into_tool_error),
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
