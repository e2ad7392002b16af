use std::sync::Arc;
use std::task::{Context, Poll};

use toolshield_contract::IntoToolError;
use toolshield_contract::{ShieldRequest, ShieldResponse, ToolError};
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::plan::{Fault, Plan};
use crate::stats::{ChaosStats, FaultKind};

/// Fault injection around a service.
///
/// Each call draws its fault from the seeded sequence, in arrival order:
///
/// - latency: waits the configured delay, then calls the service (its readiness was
///   granted before the wait); the wait ends with `CANCELLED` when the request's attempt
///   token is cancelled, and with `TIMEOUT` at the request's deadline if that comes
///   first: the tool is then not called;
/// - error: fails with `ToolError` of the configured kind (message `injected fault`),
///   without calling the service;
/// - hang: never answers; ends with `CANCELLED` when the request's attempt token is
///   cancelled, or when a timeout outside drops it;
/// - in-band: answers with `Res::in_band_failure_response(kind, ..)`
///   ([`ShieldResponse::in_band_failure_response`]) without calling the service; a
///   response type that cannot carry one gets an error of that kind instead (counted
///   as an in-band fault all the same);
/// - none: calls the service.
///
/// Every injected fault is counted in [`ChaosStats`].
#[derive(Clone)]
pub struct Chaos<S> {
    inner: S,
    plan: Arc<Plan>,
    stats: Arc<ChaosStats>,
}

impl<S> Chaos<S> {
    pub(crate) fn new(inner: S, plan: Arc<Plan>, stats: Arc<ChaosStats>) -> Self {
        Chaos { inner, plan, stats }
    }

    /// The counters shared with the layer.
    pub fn stats(&self) -> &Arc<ChaosStats> {
        &self.stats
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

impl<S: std::fmt::Debug> std::fmt::Debug for Chaos<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chaos")
            .field("inner", &self.inner)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Service<Req> for Chaos<S>
where
    S: Service<Req> + Clone,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Some(fault) = self.plan.draw() else {
            return ResponseFuture::call(self.inner.call(req));
        };
        // An injected fault stands for the tool misbehaving: to a claim on the call (a
        // mutation's idempotency key) the attempt reached the tool, as a real timeout,
        // hang or error would have, and a drop or a `TIMEOUT` leaves it `OUTCOME_UNKNOWN`.
        if let Some(state) = req.call_state() {
            state.mark_started();
        }
        match fault {
            Fault::Latency(delay) => {
                self.stats.count(FaultKind::Latency);
                // The ready service is called after the wait; its clone takes its place.
                let clone = self.inner.clone();
                let svc = std::mem::replace(&mut self.inner, clone);
                // The wait is part of the call: it ends with the call's cancellation
                // and never runs past its deadline.
                let (deadline, token) = req.call_state().map_or((None, None), |state| {
                    (state.deadline(), Some(state.tokens().attempt().clone()))
                });
                ResponseFuture::delayed(delay, deadline, token, svc, req)
            }
            Fault::Error(kind, retry_after) => {
                self.stats.count(FaultKind::Error);
                let mut error = ToolError::new(kind, "injected fault");
                if let Some(wait) = retry_after {
                    error = error.with_retry_after(wait);
                }
                ResponseFuture::ready(Err(error))
            }
            Fault::Hang => {
                self.stats.count(FaultKind::Hang);
                let token = req
                    .call_state()
                    .map(|state| state.tokens().attempt().clone());
                ResponseFuture::hang(token)
            }
            Fault::InBand(kind) => {
                self.stats.count(FaultKind::InBand);
                let out = S::Response::in_band_failure_response(kind, "injected fault")
                    .ok_or_else(|| ToolError::new(kind, "injected fault"));
                ResponseFuture::ready(out)
            }
        }
    }
}
