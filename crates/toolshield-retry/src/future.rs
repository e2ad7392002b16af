use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Sleep};
use tokio_util::sync::WaitForCancellationFutureOwned;
use toolshield_contract::config::{deadline_after, MAX_DURATION};
use toolshield_contract::time;
use toolshield_contract::IntoToolError;
use toolshield_contract::{
    AttemptGuard, CallKind, Classify, ErrorKind, Failure, Outcome, ShieldRequest, ShieldResponse,
    ToolError,
};
use tower_service::Service;

use crate::budget::RetryBudget;
use crate::shared::Shared;

pin_project! {
    /// The future of [`Retry`](crate::Retry): calling, backing off, waiting for the
    /// inner service to be ready again, calling again.
    pub struct ResponseFuture<S, Req, P>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future>,
        // The caller's token, watched while backing off and waiting for readiness; set
        // when the first retry is planned (boxed: only retries pay for it).
        cancelled: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
        // What retries call: a clone of the inner service, made for the first retry
        // (boxed: a call that succeeds first time carries no room for it).
        service: Option<Box<S>>,
        // A copy for the next attempt; `None` when the call may not be retried.
        request: Option<Req>,
        shared: Arc<Shared<P, S>>,
        attempt: u32,
        // The backoff's last delay (decorrelated jitter grows from it), zero before the
        // first: a wait a peer asked for (`Retry-After`) is not one.
        previous_backoff: Duration,
        // Why the attempt that just ended failed, for the next attempt's request.
        reason: Option<ErrorKind>,
        // Cancels the attempt token this future created if it is dropped mid-attempt;
        // disarmed when the attempt completes.
        guard: Option<AttemptGuard>,
        // The budget token withdrawn for the retry being waited for; given back if the
        // retry never starts (the future is dropped or cancelled while backing off).
        token: Option<BudgetToken>,
    }
}

/// A retry-budget token held between the decision to retry and the retry's start.
/// Dropped unspent, it goes back to the budget.
struct BudgetToken {
    budget: Option<Arc<RetryBudget>>,
}

impl BudgetToken {
    /// The retry started: the token stays spent.
    fn spend(mut self) {
        self.budget = None;
    }
}

impl Drop for BudgetToken {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            budget.refund();
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Calling {
            #[pin]
            future: F,
        },
        // Boxed: only a retry pays for the timer, and the future a first attempt moves
        // around stays small.
        Backoff {
            sleep: Pin<Box<Sleep>>,
        },
        WaitReady,
    }
}

impl<S, Req, P> ResponseFuture<S, Req, P>
where
    S: Service<Req>,
{
    #[inline(always)]
    pub(crate) fn new(future: S::Future, request: Option<Req>, shared: Arc<Shared<P, S>>) -> Self {
        ResponseFuture {
            state: State::Calling { future },
            cancelled: None,
            service: None,
            request,
            shared,
            attempt: 1,
            previous_backoff: Duration::ZERO,
            reason: None,
            guard: None,
            token: None,
        }
    }
}

impl<S, Req, P> fmt::Debug for ResponseFuture<S, Req, P>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Backoff { .. } => "backoff",
            State::WaitReady => "wait_ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

/// What to do after an attempt.
enum Next {
    /// Return the attempt's result.
    Done,
    /// Return `CANCELLED`: the caller gave up.
    Cancelled,
    /// Try again after this wait; the attempt failed with this kind. The last field is
    /// the backoff's own delay to remember for the next one (decorrelated jitter grows
    /// from it): a `Retry-After` or rate-limit wait does not replace it, as in Polly.
    Retry(Duration, ErrorKind, Duration),
}

#[inline]
fn finish<Res: ShieldResponse>(
    mut result: Result<Res, ToolError>,
    attempts: u32,
) -> Result<Res, ToolError> {
    match &mut result {
        Ok(res) => res.set_attempts(attempts),
        Err(e) => e.set_attempts(attempts),
    }
    result
}

fn cancelled_error(attempts: u32) -> ToolError {
    ToolError::cancelled("call cancelled while waiting to retry").with_attempts(attempts)
}

/// Ends the call before the planned retry started: its budget token goes back now, not
/// when the finished future is dropped (which a caller may do much later, or never).
#[cold]
fn unstarted(token: &mut Option<BudgetToken>, error: ToolError) -> ToolError {
    drop(token.take());
    error
}

/// Decides whether attempt `attempt`, which ended with `result`, is retried, and after
/// which wait. The common case (anything but a retriable failure) stays inline.
#[inline]
fn decide<Req, Res, P, S>(
    shared: &Shared<P, S>,
    request: Option<&Req>,
    attempt: u32,
    previous_backoff: Duration,
    result: &Result<Res, ToolError>,
) -> Next
where
    Req: ShieldRequest,
    P: Classify<Res>,
{
    match shared.classifier.classify(result) {
        Outcome::Failure(failure) if failure.retriable => {
            plan_retry(shared, request, attempt, previous_backoff, failure)
        }
        _ => Next::Done,
    }
}

/// Logs why a retry was not started.
#[cold]
#[inline(never)]
fn not_started(tool: &str, attempt: u32, wait: Option<Duration>, kind: ErrorKind, why: &str) {
    tracing::debug!(
        target: "toolshield::retry",
        tool,
        attempt,
        wait_ms = wait.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
        code = kind.code(),
        reason = why,
        "retry not started"
    );
}

/// A retriable failure: whether the attempt limit, the request copy, the caller's token,
/// the deadline and the budget allow another attempt, and after which wait. Out of line:
/// the success path never comes here.
#[cold]
#[inline(never)]
fn plan_retry<Req, P, S>(
    shared: &Shared<P, S>,
    request: Option<&Req>,
    attempt: u32,
    previous_backoff: Duration,
    failure: Failure,
) -> Next
where
    Req: ShieldRequest,
{
    if attempt >= shared.max_attempts {
        return Next::Done;
    }
    // No copy: the request may not be repeated (a mutating call without a key).
    let Some(request) = request else {
        return Next::Done;
    };
    // A mutation that may have taken effect (a timeout after it was sent) is not sent
    // again, key or not: the tool may not dedupe on the key, and the idempotency layer
    // outside records the call's outcome as unknown.
    if failure.kind.may_have_taken_effect() && request.call_kind() == Some(CallKind::Mutating) {
        not_started(
            request.call_name().unwrap_or(""),
            attempt,
            None,
            failure.kind,
            "a mutation that may have taken effect is not repeated",
        );
        return Next::Done;
    }
    if request
        .call_state()
        .is_some_and(|s| s.tokens().call().is_cancelled())
    {
        return Next::Cancelled;
    }
    let mut backoff = previous_backoff;
    let wait = match (failure.retry_after, failure.kind) {
        // A peer asking for a longer wait than we park a call for: the caller (and the
        // model, through `for_model`) gets the error with its `retry_after` at once.
        (Some(wait), _) if wait.min(MAX_DURATION) > shared.max_retry_after => {
            not_started(
                request.call_name().unwrap_or(""),
                attempt,
                Some(wait),
                failure.kind,
                "retry_after is longer than max_retry_after",
            );
            return Next::Done;
        }
        (Some(wait), _) => wait,
        (None, ErrorKind::RateLimited) => shared.rate_limit_backoff,
        (None, _) => {
            backoff = shared
                .backoff
                .wait(attempt, previous_backoff, &mut fastrand::Rng::new());
            backoff
        }
    };
    // A peer's Retry-After or a custom backoff may be anything: never wait longer than
    // any configured duration may be.
    let wait = wait.min(MAX_DURATION);
    if let Some(deadline) = request.call_state().and_then(|s| s.deadline()) {
        // The retry must start with time left: at least `min_attempt_time`, and never
        // none at all (a wait ending exactly at the deadline).
        let left = time::now()
            .checked_add(wait)
            .map(|resume| deadline.saturating_duration_since(resume));
        let enough = left.is_some_and(|left| !left.is_zero() && left >= shared.min_attempt_time);
        if !enough {
            not_started(
                request.call_name().unwrap_or(""),
                attempt,
                Some(wait),
                failure.kind,
                "too little time would be left before the deadline",
            );
            return Next::Done;
        }
    }
    if let Some(budget) = &shared.budget {
        if !budget.try_withdraw() {
            not_started(
                request.call_name().unwrap_or(""),
                attempt,
                None,
                failure.kind,
                "retry budget exhausted",
            );
            return Next::Done;
        }
    }
    tracing::info!(
        target: "toolshield::retry",
        tool = request.call_name().unwrap_or(""),
        attempt,
        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        code = failure.kind.code(),
        "retrying tool call"
    );
    Next::Retry(wait, failure.kind, backoff)
}

impl<S, Req, Res, P> Future for ResponseFuture<S, Req, P>
where
    S: Service<Req, Response = Res> + Clone,
    S::Error: IntoToolError,
    Req: ShieldRequest + Clone,
    Res: ShieldResponse,
    P: Classify<Res>,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    let result = ready!(future.poll(cx)).map_err(IntoToolError::into_tool_error);
                    if let Some(guard) = this.guard.take() {
                        guard.disarm();
                    }
                    let attempt = *this.attempt;
                    let next = decide(
                        this.shared,
                        this.request.as_ref(),
                        attempt,
                        *this.previous_backoff,
                        &result,
                    );
                    match next {
                        Next::Done => return Poll::Ready(finish(result, attempt)),
                        Next::Cancelled => return Poll::Ready(Err(cancelled_error(attempt))),
                        Next::Retry(wait, kind, backoff) => {
                            *this.token = this.shared.budget.clone().map(|budget| BudgetToken {
                                budget: Some(budget),
                            });
                            *this.previous_backoff = backoff;
                            *this.reason = Some(kind);
                            if this.cancelled.is_none() {
                                let token = this
                                    .request
                                    .as_ref()
                                    .and_then(|r| r.call_state())
                                    .map(|s| s.tokens().call().clone());
                                if let Some(token) = token {
                                    *this.cancelled = Some(Box::pin(token.cancelled_owned()));
                                }
                            }
                            if wait.is_zero() {
                                this.state.set(State::WaitReady);
                            } else {
                                this.state.set(State::Backoff {
                                    sleep: Box::pin(sleep_until(deadline_after(time::now(), wait))),
                                });
                            }
                        }
                    }
                }
                StateProj::Backoff { sleep } => {
                    if let Some(cancelled) = this.cancelled.as_mut() {
                        if cancelled.as_mut().poll(cx).is_ready() {
                            let e = cancelled_error(*this.attempt);
                            return Poll::Ready(Err(unstarted(this.token, e)));
                        }
                    }
                    ready!(sleep.as_mut().poll(cx));
                    this.state.set(State::WaitReady);
                }
                StateProj::WaitReady => {
                    if let Some(cancelled) = this.cancelled.as_mut() {
                        if cancelled.as_mut().poll(cx).is_ready() {
                            let e = cancelled_error(*this.attempt);
                            return Poll::Ready(Err(unstarted(this.token, e)));
                        }
                    }
                    if this.service.is_none() {
                        *this.service = this.shared.service_for_retry().map(Box::new);
                    }
                    let Some(service) = this.service.as_mut() else {
                        let e = ToolError::internal("retry has no service to call again")
                            .with_attempts(*this.attempt);
                        return Poll::Ready(Err(unstarted(this.token, e)));
                    };
                    if let Err(e) = ready!(service.poll_ready(cx)) {
                        let e = e.into_tool_error().with_attempts(*this.attempt);
                        return Poll::Ready(Err(unstarted(this.token, e)));
                    }
                    let next_attempt = this.attempt.saturating_add(1);
                    // The last allowed attempt takes the copy; earlier ones clone it.
                    let request = if next_attempt < this.shared.max_attempts {
                        this.request.clone()
                    } else {
                        this.request.take()
                    };
                    let Some(mut request) = request else {
                        let e = ToolError::internal("retry lost its request copy")
                            .with_attempts(*this.attempt);
                        return Poll::Ready(Err(unstarted(this.token, e)));
                    };
                    *this.attempt = next_attempt;
                    request.begin_attempt(next_attempt);
                    if let Some(kind) = *this.reason {
                        if let Some(state) = request.call_state_mut() {
                            state.set_retry_reason(Some(kind));
                        }
                    }
                    *this.guard = request
                        .call_state()
                        .map(|s| s.tokens().clone().guard_attempt());
                    let future = service.call(request);
                    if let Some(token) = this.token.take() {
                        token.spend();
                    }
                    this.state.set(State::Calling { future });
                }
            }
        }
    }
}
