use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use toolshield_contract::config::deadline_after;
use toolshield_contract::time;
use toolshield_contract::IntoToolError;
use toolshield_contract::{
    AttemptGuard, ErrorKind, Hedged, ShieldRequest, ShieldResponse, ToolError,
};
use tower_service::Service;

use crate::service::Shared;

pin_project! {
    /// The future of [`Hedge`](crate::Hedge).
    ///
    /// The first attempt and the hedge timer are held inline (a call answered before the
    /// delay allocates nothing); hedges are boxed, as only a hedged call pays for them.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        first: Option<S::Future>,
        // Created when the first attempt does not answer on its first poll.
        #[pin]
        timer: Option<Sleep>,
        hedging: Option<Hedging<S, Req>>,
    }
}

/// The state of a call that may be hedged.
struct Hedging<S, Req>
where
    S: Service<Req>,
{
    /// The service hedges are sent to; `None` once hedging is closed (the maximum is
    /// reached, the budget refused, the call is cancelled or past its deadline, an attempt
    /// was refused by a limit inside, or the service failed): dropped then, so a readiness
    /// it reserved (a permit of a concurrency limit) is given back at once.
    svc: Option<S>,
    req: Req,
    shared: Arc<Shared>,
    start: Instant,
    delay: Duration,
    /// When the last attempt was sent: the timer runs from there.
    last_sent: Instant,
    /// Cancels the first attempt's token unless it answered.
    first_guard: Option<AttemptGuard>,
    hedges: Vec<Attempt<S::Future>>,
    /// Attempts sent, the first included.
    sent: u32,
    /// The next hedge goes as soon as the service is ready (timer fired, or a failure).
    due: bool,
    last_failure: Option<Result<S::Response, ToolError>>,
}

struct Attempt<F> {
    fut: Pin<Box<F>>,
    guard: Option<AttemptGuard>,
    number: u32,
    start: Instant,
}

enum Verdict<R> {
    Win(R),
    /// A failure that another copy would repeat: ends the call.
    Fatal(Result<R, ToolError>),
    /// A failure another attempt may not have.
    Failed(Result<R, ToolError>),
    /// Refused by a layer inside before the tool ran (an open breaker, a full bulkhead, a
    /// rate limit): attempts already admitted keep running, and no further hedge is sent
    /// into the refusal, which every copy would meet as well.
    Refused(Result<R, ToolError>),
}

/// Whether a failure of `kind` is a refusal by a limit before the tool ran (an open
/// breaker, a full bulkhead, a rate limit or the upstream's own 429), whether it comes
/// as an error or in-band, in a response (an HTTP 429).
fn is_refusal(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::CircuitOpen | ErrorKind::Overloaded | ErrorKind::RateLimited
    )
}

fn judge<R: ShieldResponse, E: IntoToolError>(result: Result<R, E>) -> Verdict<R> {
    match result {
        Ok(res) => match res.in_band_failure() {
            None => Verdict::Win(res),
            Some(f) if is_refusal(f.kind) => Verdict::Refused(Ok(res)),
            Some(f) if f.kind.is_retriable() => Verdict::Failed(Ok(res)),
            Some(_) => Verdict::Fatal(Ok(res)),
        },
        Err(e) => {
            let e = e.into_tool_error();
            if is_refusal(e.kind()) {
                Verdict::Refused(Err(e))
            } else if e.is_retriable() {
                Verdict::Failed(Err(e))
            } else {
                Verdict::Fatal(Err(e))
            }
        }
    }
}

enum Launch {
    Sent,
    NotReady,
    Closed,
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    pub(crate) fn passthrough(first: S::Future) -> Self {
        ResponseFuture {
            first: Some(first),
            timer: None,
            hedging: None,
        }
    }

    pub(crate) fn hedging(
        first: S::Future,
        svc: S,
        req: Req,
        shared: Arc<Shared>,
        start: Instant,
        delay: Duration,
        first_guard: Option<AttemptGuard>,
    ) -> Self {
        ResponseFuture {
            first: Some(first),
            timer: None,
            hedging: Some(Hedging {
                svc: Some(svc),
                req,
                shared,
                start,
                delay,
                last_sent: start,
                first_guard,
                hedges: Vec::new(),
                sent: 1,
                due: false,
                last_failure: None,
            }),
        }
    }
}

impl<S, Req> std::fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ResponseFuture");
        d.field("first_running", &self.first.is_some());
        if let Some(h) = &self.hedging {
            d.field("sent", &h.sent).field("delay", &h.delay);
        }
        d.finish_non_exhaustive()
    }
}

impl<S, Req> Hedging<S, Req>
where
    S: Service<Req>,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
    Req: ShieldRequest + Clone,
{
    /// Sends the next hedge if the maximum, the call, the service and the budget allow.
    ///
    /// The budget is asked only once the service is ready, right before the hedge is
    /// sent: a hedge still waiting for readiness when the call ends (or is dropped) has
    /// taken nothing from it.
    fn launch(&mut self, cx: &mut Context<'_>) -> Launch {
        if self.sent > self.shared.max_hedges {
            return self.close();
        }
        if let Some(state) = self.req.call_state() {
            let cancelled = state.tokens().call().is_cancelled();
            let expired = state.deadline().is_some_and(|d| d <= time::now());
            if cancelled || expired {
                return self.close();
            }
        }
        let Some(svc) = self.svc.as_mut() else {
            return self.close();
        };
        match svc.poll_ready(cx) {
            Poll::Pending => Launch::NotReady,
            Poll::Ready(Err(e)) => {
                if self.last_failure.is_none() {
                    self.last_failure = Some(Err(e.into_tool_error()));
                }
                self.close()
            }
            Poll::Ready(Ok(())) => {
                if let Some(budget) = &self.shared.budget {
                    if !budget.try_withdraw() {
                        self.shared
                            .stats
                            .budget_denied
                            .fetch_add(1, Ordering::Relaxed);
                        // Dropping the ready service gives back what its readiness holds.
                        return self.close();
                    }
                }
                self.due = false;
                self.sent += 1;
                let mut req = self.req.clone();
                // Its own attempt token (a child of the call token) and, for a request
                // with an id per attempt, its own execution id.
                req.renew_attempt();
                let guard = req
                    .call_state()
                    .map(|state| state.tokens().clone().guard_attempt());
                let now = time::now();
                self.last_sent = now;
                self.hedges.push(Attempt {
                    fut: Box::pin(svc.call(req)),
                    guard,
                    number: self.sent,
                    start: now,
                });
                self.shared
                    .stats
                    .hedges_sent
                    .fetch_add(1, Ordering::Relaxed);
                Launch::Sent
            }
        }
    }

    /// Whether hedging is closed: no more hedges.
    fn closed(&self) -> bool {
        self.svc.is_none()
    }

    /// No more hedges: the service is dropped with whatever its readiness holds.
    fn close(&mut self) -> Launch {
        self.svc = None;
        Launch::Closed
    }

    /// The winner's response: its latency recorded, the hedge mark set. The losers are
    /// dropped (and their tokens cancelled) when the caller drops this state.
    fn win(&mut self, mut res: S::Response, number: u32, start: Instant) -> S::Response {
        if let Some(histogram) = self.shared.delay.histogram() {
            histogram.record(time::now().saturating_duration_since(start));
        }
        if self.sent > 1 {
            res.mark_hedged(Hedged {
                answered_by: number,
                sent: self.sent,
            });
            if number > 1 {
                self.shared.stats.hedge_wins.fetch_add(1, Ordering::Relaxed);
            }
        }
        res
    }

    /// An attempt refused before it ran: the call goes on with the attempts in flight (the
    /// refusal is its answer only if none of them answers), and hedging stops.
    fn refused(&mut self, out: Result<S::Response, ToolError>) {
        self.last_failure = Some(out);
        self.close();
    }

    fn poll_attempts(
        &mut self,
        mut first: Pin<&mut Option<S::Future>>,
        mut timer: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<S::Response, ToolError>> {
        loop {
            if let Some(fut) = first.as_mut().as_pin_mut() {
                if let Poll::Ready(result) = fut.poll(cx) {
                    first.set(None);
                    if let Some(guard) = self.first_guard.take() {
                        guard.disarm();
                    }
                    match judge(result) {
                        Verdict::Win(res) => return Poll::Ready(Ok(self.win(res, 1, self.start))),
                        Verdict::Fatal(out) => return Poll::Ready(out),
                        Verdict::Failed(out) => {
                            self.last_failure = Some(out);
                            self.due = true;
                        }
                        Verdict::Refused(out) => self.refused(out),
                    }
                }
            }

            let mut i = 0;
            while i < self.hedges.len() {
                let Poll::Ready(result) = self.hedges[i].fut.as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                let attempt = self.hedges.swap_remove(i);
                if let Some(guard) = attempt.guard {
                    guard.disarm();
                }
                match judge(result) {
                    Verdict::Win(res) => {
                        return Poll::Ready(Ok(self.win(res, attempt.number, attempt.start)))
                    }
                    Verdict::Fatal(out) => return Poll::Ready(out),
                    Verdict::Failed(out) => {
                        self.last_failure = Some(out);
                        self.due = true;
                    }
                    Verdict::Refused(out) => self.refused(out),
                }
            }

            if self.due && !self.closed() {
                match self.launch(cx) {
                    Launch::Sent => {
                        // The next timer runs from this hedge.
                        timer.set(None);
                        continue;
                    }
                    Launch::NotReady | Launch::Closed => {}
                }
            }

            if !self.due && !self.closed() {
                if timer.is_none() {
                    timer.set(Some(sleep_until(deadline_after(
                        self.last_sent,
                        self.delay,
                    ))));
                }
                if let Some(sleep) = timer.as_mut().as_pin_mut() {
                    if sleep.poll(cx).is_ready() {
                        timer.set(None);
                        self.due = true;
                        continue;
                    }
                }
            }

            let in_flight = first.is_some() || !self.hedges.is_empty();
            if !in_flight && (self.closed() || !self.due) {
                return Poll::Ready(self.last_failure.take().unwrap_or_else(|| {
                    Err(ToolError::internal("hedged call ended without a result"))
                }));
            }
            return Poll::Pending;
        }
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
    Req: ShieldRequest + Clone,
{
    type Output = Result<S::Response, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(hedging) = this.hedging.as_mut() else {
            let Some(fut) = this.first.as_mut().as_pin_mut() else {
                return Poll::Ready(Err(ToolError::internal(
                    "hedge future polled after completion",
                )));
            };
            let result = ready!(fut.poll(cx));
            this.first.set(None);
            return Poll::Ready(result.map_err(IntoToolError::into_tool_error));
        };
        let out = ready!(hedging.poll_attempts(this.first.as_mut(), this.timer.as_mut(), cx));
        // Drop every other attempt now (their guards cancel their tokens), not when the
        // caller drops this future.
        *this.hedging = None;
        this.first.set(None);
        this.timer.set(None);
        Poll::Ready(out)
    }
}
