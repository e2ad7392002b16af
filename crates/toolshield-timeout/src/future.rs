use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use toolshield_contract::{AttemptGuard, ShieldResponse, SlowCall, ToolError};

/// Which limit a [`ResponseFuture`] enforces, for the error message.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expiry {
    Attempt(Duration),
    Total(Duration),
    /// The deadline the request carried, earlier than the attempt timeout.
    Request,
}

pin_project! {
    /// The future of [`Timeout`](crate::Timeout) and [`Deadline`](crate::Deadline).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        expiry: Expiry,
        start: Instant,
        soft: Option<Duration>,
        // Cancels the attempt token if this future is dropped or expires before the inner
        // future finishes; disarmed on completion.
        guard: Option<AttemptGuard>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Running {
            #[pin]
            inner: F,
            #[pin]
            sleep: Sleep,
        },
        Failed {
            error: Option<ToolError>,
        },
        Done,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn running(
        inner: F,
        expires: Instant,
        expiry: Expiry,
        start: Instant,
        soft: Option<Duration>,
        guard: Option<AttemptGuard>,
    ) -> Self {
        ResponseFuture {
            state: State::Running {
                inner,
                sleep: sleep_until(expires),
            },
            expiry,
            start,
            soft,
            guard,
        }
    }

    pub(crate) fn failed(error: ToolError) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
            expiry: Expiry::Total(Duration::ZERO),
            start: Instant::now(),
            soft: None,
            guard: None,
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("expiry", &self.expiry)
            .field("soft", &self.soft)
            .finish_non_exhaustive()
    }
}

impl<F, Res, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<ToolError>,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let (inner, sleep) = match this.state.as_mut().project() {
            StateProj::Running { inner, sleep } => (inner, sleep),
            StateProj::Failed { error } => {
                let error = error.take().unwrap_or_else(|| {
                    ToolError::internal("timeout future polled after completion")
                });
                this.state.set(State::Done);
                return Poll::Ready(Err(error));
            }
            StateProj::Done => {
                return Poll::Ready(Err(ToolError::internal(
                    "timeout future polled after completion",
                )))
            }
        };

        if let Poll::Ready(result) = inner.poll(cx) {
            if let Some(guard) = this.guard.take() {
                guard.disarm();
            }
            this.state.set(State::Done);
            return Poll::Ready(match result {
                Ok(mut res) => {
                    if let Some(threshold) = *this.soft {
                        let elapsed = this.start.elapsed();
                        if elapsed >= threshold {
                            tracing::info!(
                                target: "toolshield::timeout",
                                elapsed_ms = elapsed.as_millis() as u64,
                                threshold_ms = threshold.as_millis() as u64,
                                "slow call"
                            );
                            res.mark_slow(SlowCall { elapsed, threshold });
                        }
                    }
                    Ok(res)
                }
                Err(e) => Err(e.into()),
            });
        }

        ready!(sleep.poll(cx));
        // Drop the inner future now, not when our caller drops us, then cancel the
        // attempt token (dropping the guard cancels it).
        this.state.set(State::Done);
        drop(this.guard.take());
        let error = match *this.expiry {
            Expiry::Attempt(d) => ToolError::timeout(format!("attempt timed out after {d:?}")),
            Expiry::Total(d) => ToolError::timeout(format!("call exceeded its deadline of {d:?}")),
            Expiry::Request => ToolError::timeout("call reached its deadline"),
        };
        Poll::Ready(Err(error.with_elapsed(this.start.elapsed())))
    }
}
