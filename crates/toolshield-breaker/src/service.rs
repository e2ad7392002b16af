//! [`Breaker`]: the service.

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use toolshield_contract::{
    Classify, DefaultClassifier, ErrorKind, ShieldRequest, ShieldResponse, ToolError,
};
use tower_service::Service;

use crate::events::CircuitState;
use crate::future::{CallGuard, Handle, ResponseFuture, SharedHandle};
use crate::key::{KeyFn, ToolKey};
use crate::registry::BreakerRegistry;
use crate::state::TicketKind;

/// Per-key circuit breakers around a service; built by [`BreakerLayer`](crate::BreakerLayer).
///
/// `call` looks up the breaker of the request's key (a per-service cache makes a repeat
/// of the last key a string compare), admits or rejects the call with `CIRCUIT_OPEN`
/// (never in `poll_ready`), and the [`ResponseFuture`] records the classified outcome.
pub struct Breaker<S, K = ToolKey, C = DefaultClassifier, H = SharedHandle> {
    inner: S,
    registry: BreakerRegistry,
    key_fn: K,
    classifier: C,
    cached: Option<H>,
}

impl<S, K, C, H> Breaker<S, K, C, H> {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: S, registry: BreakerRegistry, key_fn: K, classifier: C) -> Self {
        Breaker {
            inner,
            registry,
            key_fn,
            classifier,
            cached: None,
        }
    }

    /// Starts with `state` as the breaker of its last key (a pinned key's, in a slot of
    /// this service's own).
    pub(crate) fn with_cached(mut self, state: Option<H>) -> Self {
        self.cached = state;
        self
    }

    /// The registry.
    pub fn registry(&self) -> &BreakerRegistry {
        &self.registry
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K: Clone, C: Clone, H: Clone> Clone for Breaker<S, K, C, H> {
    fn clone(&self) -> Self {
        Breaker {
            inner: self.inner.clone(),
            registry: self.registry.clone(),
            key_fn: self.key_fn.clone(),
            classifier: self.classifier.clone(),
            cached: self.cached.clone(),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug, C: fmt::Debug, H> fmt::Debug for Breaker<S, K, C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("inner", &self.inner)
            .field("registry", &self.registry)
            .field("key_fn", &self.key_fn)
            .field("classifier", &self.classifier)
            .finish_non_exhaustive()
    }
}

fn rejection(key: &str, state: CircuitState, retry_after: Option<Duration>) -> ToolError {
    let message = match state {
        CircuitState::ForcedOpen => format!("circuit forced open for `{key}`"),
        CircuitState::HalfOpen => format!("circuit half-open for `{key}`: probe limit reached"),
        _ => format!("circuit open for `{key}`"),
    };
    let error = ToolError::new(ErrorKind::CircuitOpen, message);
    match retry_after {
        Some(wait) => error.with_retry_after(wait),
        None => error,
    }
}

impl<S, K, C, H, Req> Service<Req> for Breaker<S, K, C, H>
where
    H: Handle,
    S: Service<Req>,
    S::Error: Into<ToolError>,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
    K: KeyFn<Req>,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future, C, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline(always)]
    fn call(&mut self, mut req: Req) -> Self::Future {
        let key = self.key_fn.key(&req);
        let held = H::lookup(&self.registry, &mut self.cached, &key);
        let state = held.state();
        let ticket = match state.admit() {
            Ok(ticket) => ticket,
            Err(retry_after) => {
                return ResponseFuture::rejected(rejection(&key, state.state(), retry_after))
            }
        };
        drop(key);
        if ticket.kind == TicketKind::Probe {
            if let Some(state) = req.call_state_mut() {
                state.set_probe(true);
            }
        }
        let slow_check = state
            .slow_threshold_nanos()
            .map(|threshold| (state.now_nanos(), threshold));
        let guard = CallGuard::new(held, ticket, slow_check);
        ResponseFuture::called(self.inner.call(req), guard, self.classifier.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::future::{pending, Pending};
    use std::sync::Arc;

    use serde_json::json;
    use toolshield_contract::CallKind;
    use toolshield_core::{ToolRequest, ToolResponse};
    use tower::{service_fn, Layer};

    use super::*;
    use crate::future::{Slot, SlotHandle};
    use crate::BreakerLayer;

    /// A tool whose calls never finish (wrapped in `service_fn`): the call's future holds
    /// its reference as long as the test keeps it.
    fn hangs(_req: ToolRequest) -> Pending<Result<ToolResponse, ToolError>> {
        pending()
    }

    fn request() -> ToolRequest {
        ToolRequest::new("weather", json!({})).kind(CallKind::ReadOnly)
    }

    fn slot_of<S, K, C>(svc: &Breaker<S, K, C, SlotHandle>) -> Option<&Arc<Slot>> {
        svc.cached.as_ref().map(|h| &h.0)
    }

    #[test]
    fn calls_of_a_pinned_service_count_on_its_slot_not_on_the_shared_breaker() {
        let registry = BreakerRegistry::default();
        let layer = BreakerLayer::new(registry.clone()).pin_key("weather");
        let state = registry.pinned("weather");
        let mut a = layer.layer(service_fn(hangs));
        let b = layer.layer(service_fn(hangs));
        let a2 = a.clone();
        // Each built service has a slot of its own; a clone shares its service's.
        let (sa, sb, sa2) = (
            slot_of(&a).unwrap(),
            slot_of(&b).unwrap(),
            slot_of(&a2).unwrap(),
        );
        assert!(!Arc::ptr_eq(sa, sb));
        assert!(Arc::ptr_eq(sa, sa2));

        let shared_before = Arc::strong_count(&state);
        let slot_before = Arc::strong_count(sa);
        let calls: Vec<_> = (0..3).map(|_| a.call(request())).collect();
        // Three calls in flight: three references on the slot, none on the breaker.
        assert_eq!(Arc::strong_count(&state), shared_before);
        assert_eq!(Arc::strong_count(slot_of(&a).unwrap()), slot_before + 3);
        drop(calls);
        assert_eq!(Arc::strong_count(slot_of(&a).unwrap()), slot_before);
        // The calls were admitted by the one shared breaker.
        assert_eq!(registry.state("weather"), CircuitState::Closed);
    }

    #[test]
    fn a_pinned_service_called_with_another_key_uses_that_keys_breaker() {
        let registry = BreakerRegistry::default();
        let mut svc = BreakerLayer::new(registry.clone())
            .pin_key("weather")
            .layer(service_fn(hangs));
        let other = ToolRequest::new("search", json!({})).kind(CallKind::ReadOnly);
        let call = svc.call(other);
        assert!(
            registry.status("search").is_some(),
            "looked up by its own key"
        );
        drop(call);
        // Back to the pinned key: its breaker again, in a slot of the service's own.
        drop(svc.call(request()));
        let state = registry.pinned("weather");
        assert!(Arc::ptr_eq(&slot_of(&svc).unwrap().state, &state));
    }
}
