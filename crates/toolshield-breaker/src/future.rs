//! [`ResponseFuture`]: records the outcome of an admitted call, or yields the rejection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use toolshield_contract::{Classify, Outcome, ShieldResponse, ToolError};

use crate::state::{BreakerState, Record, Ticket, TicketKind};

/// Holds an admitted call's ticket until its outcome is known. Dropped unfinished (the
/// caller dropped the future), a half-open probe gives its permit back and records
/// nothing.
pub(crate) struct CallGuard {
    state: Arc<BreakerState>,
    ticket: Ticket,
    /// With a `slow_call_duration` of the breaker's own: the call's start and that
    /// threshold, both on the registry clock; the outcome then reads the clock once more.
    slow_check: Option<(u64, u64)>,
    done: bool,
}

impl CallGuard {
    pub(crate) fn new(
        state: Arc<BreakerState>,
        ticket: Ticket,
        slow_check: Option<(u64, u64)>,
    ) -> Self {
        CallGuard {
            state,
            ticket,
            slow_check,
            done: false,
        }
    }

    pub(crate) fn finish(mut self, outcome: Outcome, marked_slow: bool) {
        self.done = true;
        // Without a threshold of its own the breaker's shared config is not touched here.
        let slow = marked_slow
            || self.slow_check.is_some_and(|(start, threshold)| {
                self.state.now_nanos().saturating_sub(start) >= threshold
            });
        let record = match outcome {
            Outcome::Success => Record::Success { slow },
            Outcome::Failure(f) if f.counts_for_breaker => Record::Failure { slow },
            Outcome::Failure(_) | Outcome::Ignored | Outcome::Cancelled => Record::Ignore,
        };
        self.state.record(self.ticket, record);
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.done && self.ticket.kind == TicketKind::Probe {
            self.state.release_permit(self.ticket.epoch);
        }
    }
}

pin_project! {
    /// The future of [`Breaker`](crate::Breaker): the inner call, recorded when it
    /// completes, or the `CIRCUIT_OPEN` rejection.
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Called {
            #[pin]
            fut: F,
            guard: Option<CallGuard>,
            classifier: C,
        },
        Rejected {
            error: Option<ToolError>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(fut: F, guard: CallGuard, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                fut,
                guard: Some(guard),
                classifier,
            },
        }
    }

    pub(crate) fn rejected(error: ToolError) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
        }
    }
}

impl<F, C, Res, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<ToolError>,
    C: Classify<Res>,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Rejected { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| ToolError::internal("breaker future polled after completion")))),
            KindProj::Called {
                fut,
                guard,
                classifier,
            } => {
                let result = ready!(fut.poll(cx)).map_err(Into::into);
                if let Some(guard) = guard.take() {
                    let outcome = classifier.classify(&result);
                    let slow = matches!(&result, Ok(res) if res.slow_call().is_some());
                    guard.finish(outcome, slow);
                }
                Poll::Ready(result)
            }
        }
    }
}
