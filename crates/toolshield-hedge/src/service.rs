use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use toolshield_contract::time;
use toolshield_contract::IntoToolError;
use toolshield_contract::{idempotency_key_of, CallKind, ShieldRequest, ShieldResponse, ToolError};
use tower_service::Service;

use crate::budget::HedgeBudget;
use crate::future::ResponseFuture;
use crate::layer::{HedgeDelay, HedgeLayer, HedgeStats};

/// What every clone of a [`Hedge`] shares.
pub(crate) struct Shared {
    pub(crate) delay: HedgeDelay,
    pub(crate) max_hedges: u32,
    pub(crate) budget: Option<Arc<dyn HedgeBudget>>,
    pub(crate) own_budget: bool,
    pub(crate) stats: Arc<HedgeStats>,
}

/// Hedged requests: a slow read-only call gets company.
///
/// A call that may be sent twice (its [`call_kind`](ShieldRequest::call_kind) is
/// `ReadOnly`, or `Idempotent` with an idempotency key) goes to the inner service at
/// once; if it has not answered after the delay, a copy is sent (a hedge), up to
/// `max_hedges` of them, each `delay` after the previous one. The first acceptable
/// result wins: the other attempts are dropped and their attempt tokens cancelled. A
/// retriable failure of one attempt sends the next hedge at once (as Polly's hedging
/// does) and does not end the call while another attempt may still succeed; a
/// non-retriable failure (`INVALID_INPUT`, `NOT_FOUND`, `CANCELLED`, ...) ends it at
/// once, as every copy would fail the same way. An attempt refused with `CIRCUIT_OPEN` (a
/// breaker inside, which may have admitted an earlier attempt as its half-open probe),
/// `OVERLOADED` (a full bulkhead) or `RATE_LIMITED` (a rate limit) stops hedging, as
/// every copy would be refused too, but leaves the attempts in flight running. When every attempt failed and
/// no hedge is left, the last failure is returned.
///
/// Every other call (`Mutating`, `Idempotent` without a key, or a kind the request does
/// not know) passes through untouched: nothing is cloned and nothing is timed.
///
/// Each hedge is a clone of the request with its own attempt token, a child of the call
/// token: cancelling the call cancels every attempt, and dropping this future (a timeout
/// outside, a caller that went away) drops every attempt and cancels their tokens. A
/// hedge withdraws a token from the budget, if one is set, when it is sent (once the
/// service is ready: a hedge that never ran takes nothing); none left, no hedge. No hedge
/// starts once the call is cancelled or past its deadline. When more than one attempt
/// was sent the response is marked ([`ShieldResponse::mark_hedged`]) with the attempt
/// that answered.
#[derive(Clone)]
pub struct Hedge<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Hedge<S> {
    pub(crate) fn from_layer(inner: S, layer: &HedgeLayer) -> Self {
        Hedge {
            inner,
            shared: Arc::new(Shared {
                delay: layer.delay.clone(),
                max_hedges: layer.max_hedges,
                budget: layer.budget.clone(),
                own_budget: layer.own_budget,
                stats: Arc::clone(&layer.stats),
            }),
        }
    }

    /// Wraps `inner` with the settings of `layer` (the same as `layer.layer(inner)`).
    #[must_use]
    pub fn new(inner: S, layer: &HedgeLayer) -> Self {
        Self::from_layer(inner, layer)
    }

    /// The counters shared with the layer.
    pub fn stats(&self) -> &Arc<HedgeStats> {
        &self.shared.stats
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

impl<S: std::fmt::Debug> std::fmt::Debug for Hedge<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hedge")
            .field("inner", &self.inner)
            .field("delay", &self.shared.delay)
            .field("max_hedges", &self.shared.max_hedges)
            .finish_non_exhaustive()
    }
}

/// Whether a call may be sent more than once.
#[inline]
fn may_hedge<Req: ShieldRequest>(req: &Req) -> bool {
    match req.call_kind() {
        Some(CallKind::ReadOnly) => true,
        // Only under a key (a blank one is none).
        Some(CallKind::Idempotent) => idempotency_key_of(req).is_some(),
        Some(CallKind::Mutating) | None => false,
    }
}

impl<S, Req> Service<Req> for Hedge<S>
where
    S: Service<Req> + Clone,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
    Req: ShieldRequest + Clone,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        if !may_hedge(&req) {
            return ResponseFuture::passthrough(self.inner.call(req));
        }
        self.shared.stats.eligible.fetch_add(1, Ordering::Relaxed);
        if self.shared.own_budget {
            if let Some(budget) = &self.shared.budget {
                budget.deposit();
            }
        }
        // The ready service answers the first attempt; the clone left in its place is
        // polled for readiness before it is called again.
        let clone = self.inner.clone();
        let mut svc = std::mem::replace(&mut self.inner, clone);
        let start = time::now();
        let delay = self.shared.delay.current();
        // The guard cancels this call's attempt token, not one a template's clones share.
        toolshield_contract::own_call(&mut req);
        let guard = req
            .call_state()
            .map(|state| state.tokens().clone().guard_attempt());
        let copy = req.clone();
        let first = svc.call(req);
        ResponseFuture::hedging(
            first,
            svc,
            copy,
            Arc::clone(&self.shared),
            start,
            delay,
            guard,
        )
    }
}
