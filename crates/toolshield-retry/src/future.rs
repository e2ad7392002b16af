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
        // A copy for the next attempt; `None` when the call may not be retried.
        request: Option<Req>,
        shared: Arc<Shared<P, S>>,
        attempt: u32,
        // What only a retry needs, in one box made when the first retry is planned: a
        // call that succeeds first time carries, moves and drops none of it.
        retry: Option<Pin<Box<Retrying<S>>>>,
    }
}

pin_project! {
    /// The state of a call with a retry planned: made when the first one is.
    struct Retrying<S> {
        // The caller's token, watched while backing off and waiting for readiness.
        #[pin]
        cancelled: Option<WaitForCancellationFutureOwned>,
        // The backoff's timer, made at the first wait and reset for the next ones.
        #[pin]
        sleep: Option<Sleep>,
        // What retries call: a clone of the inner service, made for the first retry.
        service: Option<S>,
        // The backoff's last delay (decorrelated jitter grows from it): a wait a peer
        // asked for (`Retry-After`) is not one.
        previous_backoff: Duration,
        // Why the attempt that just ended failed, for the next attempt's request.
        reason: ErrorKind,
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
        Backoff,
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
            request,
            shared,
            attempt: 1,
            retry: None,
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
            State::Backoff => "backoff",
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
    // A refusal (nothing ran) undoes the attempt's mark on the call's claim, whether or
    // not another attempt follows: a mutation dropped while it waits, or cancelled
    // meanwhile, ran nothing.
    if failure.kind.is_retriable() && !failure.kind.may_have_taken_effect() {
        if let Some(state) = request.call_state() {
            state.attempt_refused();
        }
    }
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
                    let previous_backoff = match this.retry.as_mut() {
                        Some(retry) => attempt_ended(retry.as_mut()),
                        None => Duration::ZERO,
                    };
                    let attempt = *this.attempt;
                    let next = decide(
                        this.shared,
                        this.request.as_ref(),
                        attempt,
                        previous_backoff,
                        &result,
                    );
                    match next {
                        Next::Done => return Poll::Ready(finish(result, attempt)),
                        Next::Cancelled => return Poll::Ready(Err(cancelled_error(attempt))),
                        Next::Retry(wait, kind, backoff) => {
                            let waits = arm_retry(
                                this.retry,
                                this.shared,
                                this.request.as_ref(),
                                wait,
                                kind,
                                backoff,
                            );
                            this.state.set(if waits {
                                State::Backoff
                            } else {
                                State::WaitReady
                            });
                        }
                    }
                }
                // Backing off, then waiting for readiness: both watch the caller's token.
                waiting => {
                    let backing_off = matches!(waiting, StateProj::Backoff);
                    let Some(retry) = this.retry.as_mut() else {
                        return Poll::Ready(Err(lost_state(*this.attempt)));
                    };
                    let mut retry = retry.as_mut().project();
                    if is_cancelled(retry.cancelled.as_mut(), cx) {
                        let e = cancelled_error(*this.attempt);
                        return Poll::Ready(Err(unstarted(retry.token, e)));
                    }
                    if backing_off {
                        if let Some(sleep) = retry.sleep.as_mut().as_pin_mut() {
                            ready!(sleep.poll(cx));
                        }
                        this.state.set(State::WaitReady);
                        continue;
                    }
                    if retry.service.is_none() {
                        *retry.service = this.shared.service_for_retry();
                    }
                    let Some(service) = retry.service.as_mut() else {
                        let e = ToolError::internal("retry has no service to call again")
                            .with_attempts(*this.attempt);
                        return Poll::Ready(Err(unstarted(retry.token, e)));
                    };
                    if let Err(e) = ready!(service.poll_ready(cx)) {
                        let e = e.into_tool_error().with_attempts(*this.attempt);
                        return Poll::Ready(Err(unstarted(retry.token, e)));
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
                        return Poll::Ready(Err(unstarted(retry.token, e)));
                    };
                    *this.attempt = next_attempt;
                    request.begin_attempt(next_attempt);
                    if let Some(state) = request.call_state_mut() {
                        state.set_retry_reason(Some(*retry.reason));
                    }
                    *retry.guard = request
                        .call_state()
                        .map(|s| s.tokens().clone().guard_attempt());
                    let future = service.call(request);
                    if let Some(token) = retry.token.take() {
                        token.spend();
                    }
                    this.state.set(State::Calling { future });
                }
            }
        }
    }
}

/// A retried attempt ended: its guard is disarmed. Returns the backoff's last delay.
#[cold]
fn attempt_ended<S>(retry: Pin<&mut Retrying<S>>) -> Duration {
    let retry = retry.project();
    if let Some(guard) = retry.guard.take() {
        guard.disarm();
    }
    *retry.previous_backoff
}

/// Sets up the retry just planned: the budget token it withdrew, why the attempt failed,
/// the caller's token to watch and, for a wait, the timer. Returns whether there is a
/// wait. The first retry boxes the state every retry shares.
#[cold]
#[inline(never)]
fn arm_retry<S, Req, P>(
    slot: &mut Option<Pin<Box<Retrying<S>>>>,
    shared: &Shared<P, S>,
    request: Option<&Req>,
    wait: Duration,
    kind: ErrorKind,
    backoff: Duration,
) -> bool
where
    Req: ShieldRequest,
{
    let token = shared.budget.clone().map(|budget| BudgetToken {
        budget: Some(budget),
    });
    let retry = slot.get_or_insert_with(|| {
        Box::pin(Retrying {
            cancelled: request
                .and_then(|r| r.call_state())
                .map(|s| s.tokens().call().clone().cancelled_owned()),
            sleep: None,
            service: None,
            previous_backoff: Duration::ZERO,
            reason: kind,
            guard: None,
            token: None,
        })
    });
    let mut retry = retry.as_mut().project();
    *retry.token = token;
    *retry.previous_backoff = backoff;
    *retry.reason = kind;
    if wait.is_zero() {
        return false;
    }
    let until = deadline_after(time::now(), wait);
    match retry.sleep.as_mut().as_pin_mut() {
        Some(sleep) => sleep.reset(until),
        None => retry.sleep.set(Some(sleep_until(until))),
    }
    true
}

/// Whether the caller's token, if the call has one, is cancelled.
fn is_cancelled(
    cancelled: Pin<&mut Option<WaitForCancellationFutureOwned>>,
    cx: &mut Context<'_>,
) -> bool {
    cancelled
        .as_pin_mut()
        .is_some_and(|cancelled| cancelled.poll(cx).is_ready())
}

/// A retry's state missing where a retry was planned: never expected, answered as an
/// internal error rather than a panic.
#[cold]
fn lost_state(attempts: u32) -> ToolError {
    ToolError::internal("retry lost its state").with_attempts(attempts)
}
