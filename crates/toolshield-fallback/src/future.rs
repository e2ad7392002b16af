//! [`ResponseFuture`]: the primary, then the tiers, then the escalation hook.

use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Sleep};
use toolshield_contract::IntoToolError;
use toolshield_contract::{
    time, AttemptGuard, CallKind, CallState, ErrorKind, InBandFailure, ShieldRequest,
    ShieldResponse, ToolError,
};
use tower::ServiceExt;

use crate::policy::{combine, Escalation, FallbackFailure};
use crate::shared::{BoxFuture, Shared};

pin_project! {
    /// The future of [`Fallback`].
    pub struct ResponseFuture<F, Req, Res> {
        #[pin]
        state: State<F, Req, Res>,
        req: Option<Req>,
        shared: Arc<Shared<Req, Res>>,
        errors: Vec<(Arc<str>, ToolError)>,
        escalations: u32,
        // Tiers that failed with an error after which they may have run (anything but
        // CIRCUIT_OPEN): a mutation is never sent to them again.
        ran: Vec<usize>,
        // Whether any request of this call was `Mutating`.
        mutating: bool,
        // The primary's response when it reported a failure in-band: it goes back as it
        // was if no tier takes that failure.
        held: Option<Res>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, Req, Res> {
        Primary { #[pin] fut: F },
        // `guard` cancels the tier's attempt token if the tier is dropped unfinished or
        // cut by the deadline (`fut` gives `None`); `attempt` is the tier's attempt id,
        // named on its result.
        Tier {
            fut: BoxFuture<Option<Result<Res, ToolError>>>,
            index: usize,
            guard: Option<AttemptGuard>,
            attempt: Option<[u8; 16]>,
        },
        Escalating { fut: BoxFuture<Escalation<Req, Res>> },
        Done,
    }
}

impl<F, Req, Res> ResponseFuture<F, Req, Res> {
    /// Starts with the primary's future; `req` is kept only when there are tiers.
    pub(crate) fn new(
        primary: F,
        req: Option<Req>,
        shared: Arc<Shared<Req, Res>>,
        mutating: bool,
    ) -> Self {
        ResponseFuture {
            state: State::Primary { fut: primary },
            req,
            shared,
            errors: Vec::new(),
            escalations: 0,
            ran: Vec::new(),
            mutating,
            held: None,
        }
    }
}

impl<F, Req, Res> fmt::Debug for ResponseFuture<F, Req, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("errors", &self.errors.len())
            .finish_non_exhaustive()
    }
}

const PRIMARY: &str = "primary";

impl<F, E, Req, Res> Future for ResponseFuture<F, Req, Res>
where
    F: Future<Output = Result<Res, E>>,
    E: IntoToolError,
    Req: ShieldRequest + Clone + Send + 'static,
    Res: ShieldResponse + Send + 'static,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            // `from` is the index of the next tier to consider after a failure.
            let (failed_at, error, from) = match this.state.as_mut().project() {
                StateProj::Primary { fut } => match fut.poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    // A failure reported in-band (an HTTP 503, an MCP `isError`) is an
                    // outcome like an error of its kind: the tiers' predicates judge it.
                    Poll::Ready(Ok(res)) => match res.in_band_failure() {
                        Some(failure) if this.req.is_some() => {
                            *this.held = Some(res);
                            (Arc::<str>::from(PRIMARY), in_band_error(failure), 0)
                        }
                        _ => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(res));
                        }
                    },
                    Poll::Ready(Err(e)) => (Arc::<str>::from(PRIMARY), e.into_tool_error(), 0),
                },
                StateProj::Tier {
                    fut,
                    index,
                    guard,
                    attempt,
                } => {
                    let Poll::Ready(result) = fut.as_mut().poll(cx) else {
                        return Poll::Pending;
                    };
                    let result = match result {
                        // Finished: its attempt token is not cancelled.
                        Some(result) => {
                            if let Some(guard) = guard.take() {
                                guard.disarm();
                            }
                            result
                        }
                        // Cut by the request's deadline: its attempt token is cancelled.
                        None => {
                            drop(guard.take());
                            Err(ToolError::timeout("call reached its deadline"))
                        }
                    };
                    // A tier's in-band failure is handled as an error of its kind.
                    let result = match result {
                        Ok(res) => match res.in_band_failure() {
                            Some(failure) => Err(in_band_error(failure)),
                            None => Ok(res),
                        },
                        Err(e) => Err(e),
                    };
                    match result {
                        Ok(mut res) => {
                            if let Some(id) = *attempt {
                                res.name_attempt(id);
                            }
                            res.mark_tier(&this.shared.tiers[*index].name);
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(res));
                        }
                        Err(e) => {
                            if e.kind() != ErrorKind::CircuitOpen {
                                this.ran.push(*index);
                            }
                            (this.shared.tiers[*index].name.clone(), e, *index + 1)
                        }
                    }
                }
                StateProj::Escalating { fut } => {
                    // The hook is application code: a panic in it ends this call with
                    // INTERNAL instead of unwinding through the stack.
                    let polled = panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)));
                    let decision = match polled {
                        Ok(Poll::Pending) => return Poll::Pending,
                        Ok(Poll::Ready(d)) => d,
                        Err(payload) => {
                            let error = hook_panicked(&payload, this.errors);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                    };
                    *this.escalations += 1;
                    match decision {
                        Escalation::Abort => {
                            let error = combine(this.errors);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                        Escalation::Skip(mut res) => {
                            res.mark_tier(&Arc::from("escalation"));
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(res));
                        }
                        Escalation::Retry => {}
                        Escalation::Modify(req) => {
                            *this.mutating |= req.call_kind() == Some(CallKind::Mutating);
                            *this.req = Some(req);
                        }
                    }
                    // A new round, as a hand-over from the last error: the predicates
                    // decide again, and a mutation never goes back to a tier it may have
                    // run on.
                    let Some((last_tier, last_error)) = this.errors.last() else {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(ToolError::internal(
                            "fallback escalated without an error",
                        )));
                    };
                    let skip: &[usize] = if *this.mutating { this.ran } else { &[] };
                    let next = start_tier(
                        this.shared,
                        this.req,
                        0,
                        Some(last_tier),
                        Some(last_error),
                        skip,
                    );
                    match next {
                        Err(error) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                        Ok(Some(next)) => {
                            this.errors.clear();
                            this.state.set(next);
                            continue;
                        }
                        Ok(None) => {
                            // No tier may take it: the last round's errors stand.
                            let error = combine(this.errors);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                    }
                }
                StateProj::Done => {
                    return Poll::Ready(Err(ToolError::internal(
                        "fallback future polled after completion",
                    )))
                }
            };

            let skip: &[usize] = if *this.mutating { this.ran } else { &[] };
            let next = start_tier(
                this.shared,
                this.req,
                from,
                Some(&failed_at),
                Some(&error),
                skip,
            );
            this.errors.push((failed_at, error));
            let next = match next {
                Ok(next) => next,
                Err(error) => {
                    this.state.set(State::Done);
                    // The primary answered: its response stands for a caller who left.
                    return Poll::Ready(match this.held.take() {
                        Some(res) if error.kind() == ErrorKind::Cancelled => Ok(res),
                        _ => Err(error),
                    });
                }
            };
            if let Some(next) = next {
                // A tier answers now: the primary's response is not returned any more.
                *this.held = None;
                this.state.set(next);
                continue;
            }

            // No tier takes the primary's error: it goes back as it was.
            if this.errors.len() == 1 && from == 0 && *this.escalations == 0 {
                if let Some(res) = this.held.take() {
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(res));
                }
                let (_, error) = this.errors.pop().unwrap_or_else(|| {
                    (
                        Arc::from(PRIMARY),
                        ToolError::internal("fallback lost its error"),
                    )
                });
                this.state.set(State::Done);
                return Poll::Ready(Err(error));
            }

            this.shared.stats.exhausted.fetch_add(1, Ordering::Relaxed);
            if let (Some(hook), Some(req)) = (&this.shared.escalate, this.req.as_ref()) {
                // The caller gave up: nothing more is tried, the hook is not asked.
                if call_cancelled(req) {
                    this.state.set(State::Done);
                    return Poll::Ready(Err(cancelled_error()));
                }
                if *this.escalations < this.shared.max_escalations {
                    this.shared
                        .stats
                        .escalations
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        target: "toolshield::fallback",
                        tool = req.call_name().unwrap_or(""),
                        tiers = this.errors.len(),
                        "every tier failed; escalating"
                    );
                    // The hook is application code that may do the work itself: the
                    // call's claim learns that it may have started.
                    if let Some(state) = req.call_state() {
                        state.mark_started();
                    }
                    let failure = FallbackFailure {
                        request: req.clone(),
                        errors: this.errors.clone(),
                        escalations: *this.escalations,
                    };
                    match panic::catch_unwind(AssertUnwindSafe(|| hook(failure))) {
                        Ok(fut) => {
                            this.state.set(State::Escalating { fut });
                            continue;
                        }
                        Err(payload) => {
                            let error = hook_panicked(&payload, this.errors);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                    }
                }
            }
            let error = combine(this.errors);
            this.state.set(State::Done);
            return Poll::Ready(Err(error));
        }
    }
}

/// The `INTERNAL` error of a panicking escalation hook; the tiers' errors are its source.
/// The panic text is logged, never put in the error (it may hold anything).
#[cold]
fn hook_panicked(
    payload: &Box<dyn std::any::Any + Send>,
    errors: &[(Arc<str>, ToolError)],
) -> ToolError {
    let text = toolshield_contract::panic::payload_text(&**payload);
    tracing::error!(
        target: "toolshield::fallback",
        panic = text,
        "the fallback escalation hook panicked"
    );
    let error = ToolError::internal("the fallback escalation hook panicked");
    if errors.is_empty() {
        error
    } else {
        error.with_source(combine(errors))
    }
}

/// The `INTERNAL` error of a tier predicate that panicked. The panic text is logged,
/// never put in the error (it may hold anything).
#[cold]
fn predicate_panicked(tier: &str, payload: &Box<dyn std::any::Any + Send>) -> ToolError {
    let text = toolshield_contract::panic::payload_text(&**payload);
    tracing::error!(
        target: "toolshield::fallback",
        tier,
        panic = text,
        "a fallback tier's predicate panicked"
    );
    ToolError::internal("a fallback tier's predicate panicked")
}

/// The error a failure reported in-band stands for, to the predicates, the escalation
/// hook and the combined error.
fn in_band_error(failure: InBandFailure) -> ToolError {
    let error = ToolError::new(failure.kind, "the response reported a failure in-band");
    match failure.retry_after {
        Some(wait) => error.with_retry_after(wait),
        None => error,
    }
}

/// Whether the caller cancelled the call `req` belongs to.
fn call_cancelled<Req: ShieldRequest>(req: &Req) -> bool {
    req.call_state()
        .is_some_and(|s| s.tokens().call().is_cancelled())
}

/// The error of a call whose caller cancelled it before a tier (or the hook) could run.
#[cold]
fn cancelled_error() -> ToolError {
    ToolError::cancelled("call cancelled before the fallback tier started")
}

/// The first tier at or after `from`, not in `skip`, whose predicate accepts `error`,
/// already called; `Ok(None)` when no tier takes it or the request's deadline has passed
/// (the last error stands, as retry returns it), `Err(CANCELLED)` when the caller
/// cancelled the call: a tier is another try at the call, and is never started for a
/// caller who gave up or after the call's time is up. `Err(INTERNAL)` when a predicate
/// panicked.
fn start_tier<F, Req: ShieldRequest + Clone + Send + 'static, Res: Send + 'static>(
    shared: &Arc<Shared<Req, Res>>,
    req: &Option<Req>,
    from: usize,
    failed_at: Option<&Arc<str>>,
    error: Option<&ToolError>,
    skip: &[usize],
) -> Result<Option<State<F, Req, Res>>, ToolError> {
    let Some(req) = req.as_ref() else {
        return Ok(None);
    };
    let mut chosen = None;
    for (index, tier) in shared.tiers.iter().enumerate().skip(from) {
        if skip.contains(&index) {
            continue;
        }
        let Some(e) = error else {
            chosen = Some((index, tier));
            break;
        };
        // The predicate is application code: a panic in it ends this call with INTERNAL
        // instead of unwinding through the stack, as a panicking tier or hook does.
        match panic::catch_unwind(AssertUnwindSafe(|| (tier.predicate)(req, e))) {
            Ok(true) => {
                chosen = Some((index, tier));
                break;
            }
            Ok(false) => {}
            Err(payload) => return Err(predicate_panicked(&tier.name, &payload)),
        }
    }
    let Some((index, tier)) = chosen else {
        return Ok(None);
    };
    if call_cancelled(req) {
        return Err(cancelled_error());
    }
    // The one clock read of a hand-over (the failure path only).
    let deadline = req.call_state().and_then(CallState::deadline);
    if deadline.is_some_and(|deadline| deadline <= time::now()) {
        tracing::info!(
            target: "toolshield::fallback",
            tool = req.call_name().unwrap_or(""),
            to = &*tier.name,
            "no fallback tier started: the call's deadline has passed"
        );
        return Ok(None);
    }
    if let (Some(from_tier), Some(e)) = (failed_at, error) {
        tracing::info!(
            target: "toolshield::fallback",
            tool = req.call_name().unwrap_or(""),
            from = &**from_tier,
            to = &*tier.name,
            code = e.code(),
            "handing over to the next tier"
        );
    }
    shared.stats.tiers[index].1.fetch_add(1, Ordering::Relaxed);
    // A tier is another try at the call: a fresh attempt token (the primary's may have
    // been cancelled by its attempt timeout), cancelled if the tier is dropped
    // unfinished, and for a request with an id per attempt, an execution id of its own.
    let mut req = req.clone();
    req.renew_attempt();
    let attempt = req.attempt_id();
    // A tier may be any service, with or without a stack that marks its attempts: the
    // call's claim (if a layer above holds one) learns here that the work may start.
    let guard = req.call_state().map(|state| {
        state.mark_started();
        state.tokens().clone().guard_attempt()
    });
    // Raced against the request's deadline: a tier is held to it whether or not the
    // service it wraps has a timeout of its own.
    let fut = Bounded {
        fut: tier.service.clone().oneshot(req),
        sleep: deadline.map(sleep_until),
    };
    Ok(Some(State::Tier {
        fut: Box::pin(fut),
        index,
        guard,
        attempt,
    }))
}

pin_project! {
    /// A tier's future raced against the request's deadline: `None` once the deadline is
    /// reached first (a result ready in the same poll wins).
    struct Bounded<F> {
        #[pin]
        fut: F,
        #[pin]
        sleep: Option<Sleep>,
    }
}

impl<F: Future> Future for Bounded<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.fut.poll(cx) {
            return Poll::Ready(Some(out));
        }
        match this.sleep.as_pin_mut() {
            Some(sleep) => sleep.poll(cx).map(|()| None),
            None => Poll::Pending,
        }
    }
}
