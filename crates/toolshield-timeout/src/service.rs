use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use toolshield_contract::config::{deadline_after, MAX_DURATION};
use toolshield_contract::IntoToolError;
use toolshield_contract::{time, CallState, IdleClock, ShieldRequest, ShieldResponse, ToolError};
use tower_service::Service;

use crate::future::{Expiry, Idle, ResponseFuture};

/// A per-attempt timeout that also enforces the request's deadline.
///
/// Each call of the inner service gets `attempt` to finish, or less when the request's
/// deadline ([`CallState::deadline`], set by the caller or by [`Deadline`]) comes
/// first: the attempt is cut at `min(now + attempt, deadline)`, and a request whose
/// deadline has passed fails with `TIMEOUT` without reaching the inner service. When a
/// retry layer sits outside, every attempt gets a fresh budget. On expiry the inner future is dropped at
/// once (the work is aborted), the request's attempt token is cancelled (so a tool that
/// spawned work elsewhere sees it), and the call fails with `TIMEOUT`. A success slower
/// than the soft threshold is marked with a [`SlowCall`](toolshield_contract::SlowCall) and
/// still succeeds.
///
/// With an idle limit ([`with_idle`](Self::with_idle)), an attempt that reports no progress
/// ([`Progress::report`](toolshield_contract::Progress::report)) for that long is cut too,
/// with `TIMEOUT` "no progress for ..."; each report on the attempt's copy of the request
/// resets the idle limit, and nothing extends the attempt past `attempt`.
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    attempt: Duration,
    soft: Option<Duration>,
    idle: Option<Duration>,
}

impl<S> Timeout<S> {
    /// Wraps `inner` with a hard timeout of `attempt` per call and an optional soft
    /// threshold; both are clamped to [`MAX_DURATION`].
    #[must_use]
    pub fn new(inner: S, attempt: Duration, soft: Option<Duration>) -> Self {
        Timeout {
            inner,
            attempt: attempt.min(MAX_DURATION),
            soft: soft.map(|soft| soft.min(MAX_DURATION)),
            idle: None,
        }
    }

    /// Sets (or clears) the idle limit: an attempt silent for `idle` is cut, each progress
    /// report resets it. Clamped to [`MAX_DURATION`]; an idle limit not below the attempt
    /// timeout never fires before it.
    #[must_use]
    pub fn with_idle(mut self, idle: Option<Duration>) -> Self {
        self.idle = idle.map(|idle| idle.min(MAX_DURATION));
        self
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for Timeout<S>
where
    S: Service<Req>,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline(always)]
    fn call(&mut self, mut req: Req) -> Self::Future {
        // The attempt's own start: the one clock read of this layer (a retry's later
        // attempts each get a fresh budget, so the call's entry stamp will not do).
        let start = time::now();
        // The attempt token the guard below cancels must be this call's, not one that
        // clones of a template share.
        toolshield_contract::own_call(&mut req);
        // The request's deadline is enforced here too, so it holds in every stack with an
        // attempt timeout, whether or not a total deadline is configured. Which of the
        // two ends the attempt is worked out when the timer is armed.
        let state = req.call_state();
        let deadline = state.and_then(CallState::deadline);
        if deadline.is_some_and(|deadline| deadline <= start) {
            return ResponseFuture::failed(
                ToolError::timeout("deadline passed before the attempt started"),
                start,
            );
        }
        let mut expiry = Expiry::Attempt(self.attempt);
        // The request's deadline (or the start, for none): resolved against the attempt
        // timeout when the timer is armed ([`Expiry::resolve`]), here already when an
        // idle limit needs the hard end.
        let mut expires = deadline.unwrap_or(start);
        let guard = state.map(|s| s.tokens().clone().guard_attempt());
        // Only an idle limit costs allocations: the attempt's clock, put on the copy of
        // the request the tool gets. A request type without state cannot report, so its
        // attempts are cut after `idle` like any silent one.
        let idle = self.idle.map(|limit| {
            let clock = Arc::new(IdleClock::new(start));
            if let Some(state) = req.call_state_mut() {
                state.progress_mut().set_idle_clock(Arc::clone(&clock));
            }
            expires = expiry.resolve(start, expires);
            Box::new(Idle {
                limit,
                hard: expires,
                clock,
            })
        });
        ResponseFuture::running(
            self.inner.call(req),
            expires,
            expiry,
            start,
            self.soft,
            guard,
            idle,
        )
    }
}

/// A deadline for the whole call.
///
/// Writes `now + total` on the request (keeping an earlier deadline already there), so the
/// retry layer inside never starts a wait that ends past it, and races the inner future
/// against it. A request whose deadline has already passed never reaches the inner
/// service. On expiry the inner future is dropped, the attempt token it was given is
/// cancelled, and the call fails with `TIMEOUT`.
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    total: Duration,
    /// Whether the call's attempt token is cancelled when the deadline cuts the call
    /// (off when a layer inside guards each attempt).
    guard: bool,
}

impl<S> Deadline<S> {
    /// Wraps `inner` with a whole-call budget of `total` (clamped to [`MAX_DURATION`],
    /// as [`DeadlineLayer::new`](crate::DeadlineLayer::new) does).
    #[must_use]
    pub fn new(inner: S, total: Duration) -> Self {
        Deadline {
            inner,
            total: total.min(MAX_DURATION),
            guard: true,
        }
    }

    /// Does not guard the attempt token (see
    /// [`DeadlineLayer::attempts_guarded_below`](crate::DeadlineLayer::attempts_guarded_below)).
    pub(crate) fn unguarded(mut self) -> Self {
        self.guard = false;
        self
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for Deadline<S>
where
    S: Service<Req>,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline(always)]
    fn call(&mut self, mut req: Req) -> Self::Future {
        // The whole call's budget counts from its entry stamp (no clock read when an outer
        // layer stamped it).
        let start = time::enter(&mut req);
        let own = deadline_after(start, self.total);
        // Written on the request where it has room, so the layers inside (retry, the
        // attempt timeout) see it; an earlier deadline already there is kept.
        let (deadline, guard) = match req.call_state_mut() {
            Some(state) => {
                state.set_deadline(own);
                let deadline = state.deadline().unwrap_or(own);
                // Checked before the guard exists: a call that never starts cancels no
                // token.
                if deadline <= start {
                    return passed(start);
                }
                (
                    deadline,
                    self.guard.then(|| state.tokens().clone().guard_attempt()),
                )
            }
            None => (own, None),
        };
        if deadline <= start {
            return passed(start);
        }
        ResponseFuture::running(
            self.inner.call(req),
            deadline,
            Expiry::Total(self.total),
            start,
            None,
            guard,
            None,
        )
    }
}

/// The answer of [`Deadline`] to a call whose deadline passed before it started.
#[cold]
fn passed<F>(start: tokio::time::Instant) -> ResponseFuture<F> {
    ResponseFuture::failed(
        ToolError::timeout("deadline passed before the call started"),
        start,
    )
}
