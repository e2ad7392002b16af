use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use toolshield_contract::config::deadline_after;
use toolshield_contract::IntoToolError;
use toolshield_contract::{time, AttemptGuard, IdleClock, ShieldResponse, SlowCall, ToolError};

/// Which limit a [`ResponseFuture`] enforces, for the error message.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expiry {
    /// The attempt timeout, counted from the attempt's start. Whether the request's
    /// deadline comes first is worked out only when the timer is armed: an attempt that
    /// finishes on its first poll never needs it.
    Attempt(Duration),
    Total(Duration),
    /// The deadline the request carried, earlier than the attempt timeout.
    Request,
}

impl Expiry {
    /// When the limit is reached, for an attempt that started at `start`. `expires` is
    /// the instant the limit was given as: for an attempt timeout, the deadline the
    /// request carried, or `start` itself when it carried none (a deadline not after
    /// the start never gets this far). An attempt timeout cut short by the request's
    /// deadline becomes [`Expiry::Request`].
    pub(crate) fn resolve(&mut self, start: Instant, expires: Instant) -> Instant {
        let Expiry::Attempt(limit) = *self else {
            return expires;
        };
        let end = deadline_after(start, limit);
        if expires > start && expires < end {
            *self = Expiry::Request;
            return expires;
        }
        end
    }
}

/// The idle limit of one attempt: the attempt's clock, the limit, and the hard end that
/// no report extends. Closes the clock when dropped (the attempt finished, expired or
/// was abandoned), so later reports on the attempt's copy of the request are ignored.
#[derive(Debug)]
pub(crate) struct Idle {
    pub(crate) limit: Duration,
    pub(crate) hard: Instant,
    pub(crate) clock: Arc<IdleClock>,
}

impl Idle {
    /// When the attempt is cut if it reports nothing more: its last activity plus the
    /// limit, never past the hard end.
    fn next_expiry(&self) -> Instant {
        self.clock
            .last_activity()
            .checked_add(self.limit)
            .map_or(self.hard, |at| at.min(self.hard))
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        self.clock.close();
    }
}

pin_project! {
    /// The future of [`Timeout`](crate::Timeout) and [`Deadline`](crate::Deadline).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        // When the limit is reached (for an attempt timeout, resolved from `expiry` when
        // the timer is armed); the timer is armed only if the inner future returns
        // `Pending` once, so a call that finishes on its first poll never touches the
        // runtime's timer.
        expires: Instant,
        expiry: Expiry,
        start: Instant,
        soft: Option<Duration>,
        // Cancels the attempt token if this future is dropped or expires before the inner
        // future finishes; disarmed on completion.
        guard: Option<AttemptGuard>,
        // Only with an idle limit (boxed: the rare case keeps the common future small):
        // the sleep then runs to the next idle expiry and is pushed back lazily, when it
        // fires, by the reports made since.
        idle: Option<Box<Idle>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Running {
            #[pin]
            inner: F,
            #[pin]
            timer: Timer,
        },
        Failed {
            error: Option<ToolError>,
        },
        Done,
    }
}

pin_project! {
    #[project = TimerProj]
    enum Timer {
        // Not armed yet: the inner future has not returned `Pending`.
        Unarmed,
        Armed {
            #[pin]
            sleep: Sleep,
        },
    }
}

impl<F> ResponseFuture<F> {
    // Inlined so the inner future is built in place, not moved through the call.
    #[inline]
    pub(crate) fn running(
        inner: F,
        expires: Instant,
        expiry: Expiry,
        start: Instant,
        soft: Option<Duration>,
        guard: Option<AttemptGuard>,
        idle: Option<Box<Idle>>,
    ) -> Self {
        ResponseFuture {
            state: State::Running {
                inner,
                timer: Timer::Unarmed,
            },
            expires,
            expiry,
            start,
            soft,
            guard,
            idle,
        }
    }

    pub(crate) fn failed(error: ToolError, start: Instant) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
            expires: start,
            expiry: Expiry::Total(Duration::ZERO),
            start,
            soft: None,
            guard: None,
            idle: None,
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
    E: IntoToolError,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let (inner, mut timer) = match this.state.as_mut().project() {
            StateProj::Running { inner, timer } => (inner, timer),
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
            if this.idle.is_some() {
                drop(this.idle.take());
            }
            return Poll::Ready(match result {
                Ok(mut res) => {
                    if let Some(threshold) = *this.soft {
                        // The one extra clock read, made only when a threshold is set.
                        let elapsed = time::now().saturating_duration_since(*this.start);
                        // Slower than the threshold; a zero threshold marks every success
                        // (as documented), even one that took no measurable time.
                        if elapsed > threshold || threshold.is_zero() {
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
                Err(e) => Err(e.into_tool_error()),
            });
        }

        if let TimerProj::Unarmed = timer.as_mut().project() {
            *this.expires = this.expiry.resolve(*this.start, *this.expires);
            let first = this
                .idle
                .as_deref()
                .map_or(*this.expires, Idle::next_expiry);
            timer.set(Timer::Armed {
                sleep: sleep_until(first),
            });
        }
        let TimerProj::Armed { mut sleep } = timer.project() else {
            return Poll::Pending;
        };
        let mut idle_expired = None;
        loop {
            ready!(sleep.as_mut().poll(cx));
            let Some(idle) = this.idle.as_deref() else {
                break;
            };
            let now = time::now();
            if now >= idle.hard {
                break;
            }
            // Reports made since the sleep was set push it back; nothing passes `hard`.
            let next = idle.next_expiry();
            if next > now {
                sleep.as_mut().reset(next);
                continue;
            }
            idle_expired = Some(idle.limit);
            break;
        }
        // Drop the inner future now, not when our caller drops us, then cancel the
        // attempt token (dropping the guard cancels it).
        this.state.set(State::Done);
        drop(this.idle.take());
        drop(this.guard.take());
        let error = match (idle_expired, *this.expiry) {
            (Some(limit), _) => ToolError::timeout(format!("no progress for {limit:?}")),
            (None, Expiry::Attempt(d)) => ToolError::timeout(format!("attempt exceeded {d:?}")),
            // An earlier deadline the request carried cut the budget short: worked out
            // here, on expiry, so a call that finishes pays nothing for it.
            (None, Expiry::Total(d)) if *this.expires < deadline_after(*this.start, d) => {
                ToolError::timeout("call reached its deadline")
            }
            (None, Expiry::Total(d)) => {
                ToolError::timeout(format!("call exceeded its deadline of {d:?}"))
            }
            (None, Expiry::Request) => ToolError::timeout("call reached its deadline"),
        };
        Poll::Ready(Err(
            error.with_elapsed(time::now().saturating_duration_since(*this.start))
        ))
    }
}
