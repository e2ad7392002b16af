//! [`Breaker`]: the service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use toolshield_contract::IntoToolError;
use toolshield_contract::{
    printable, Classify, DefaultClassifier, ErrorKind, ShieldRequest, ShieldResponse, ToolError,
    MAX_TOOL_NAME_SHOWN,
};
use tower_service::Service;

use crate::events::CircuitState;
use crate::future::{give_back, lookup, CallGuard, ResponseFuture};
use crate::key::{KeyFn, ToolKey};
use crate::registry::BreakerRegistry;
use crate::state::{BreakerState, TicketKind};

/// Per-key circuit breakers around a service; built by [`BreakerLayer`](crate::BreakerLayer).
///
/// `call` looks up the breaker of the request's key (a per-service cache makes a repeat
/// of the last key a string compare), admits or rejects the call with `CIRCUIT_OPEN`
/// (never in `poll_ready`), and the [`ResponseFuture`] records the classified outcome.
pub struct Breaker<S, K = ToolKey, C = DefaultClassifier> {
    inner: S,
    registry: BreakerRegistry,
    key_fn: K,
    classifier: C,
    /// The breaker of the last key called (of the pinned key, to begin with).
    cached: Option<Arc<BreakerState>>,
}

impl<S, K, C> Breaker<S, K, C> {
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

    /// Starts with `state` as the breaker of its last key (a pinned key's).
    pub(crate) fn with_cached(mut self, state: Option<Arc<BreakerState>>) -> Self {
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

impl<S: Clone, K: Clone, C: Clone> Clone for Breaker<S, K, C> {
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

impl<S: fmt::Debug, K: fmt::Debug, C: fmt::Debug> fmt::Debug for Breaker<S, K, C> {
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
    // The key may be a name a model or a remote caller chose: shown on one line, cut short.
    let key = printable(key, MAX_TOOL_NAME_SHOWN);
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

impl<S, K, C, Req> Service<Req> for Breaker<S, K, C>
where
    S: Service<Req>,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
    K: KeyFn<Req>,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline(always)]
    fn call(&mut self, mut req: Req) -> Self::Future {
        let key = self.key_fn.key(&req);
        let state = lookup(&self.registry, &mut self.cached, &key);
        let ticket = match state.admit() {
            Ok(ticket) => ticket,
            Err(retry_after) => {
                let error = rejection(&key, state.state(), retry_after);
                give_back(state);
                return ResponseFuture::rejected(error, self.classifier.clone());
            }
        };
        drop(key);
        if ticket.kind == TicketKind::Probe {
            if let Some(state) = req.call_state_mut() {
                state.set_probe(true);
            }
        }
        let guard = CallGuard::new(state, ticket);
        ResponseFuture::called(self.inner.call(req), guard, self.classifier.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::future::{pending, ready, Pending, Ready};
    use std::sync::Arc;

    use serde_json::json;
    use toolshield_contract::CallKind;
    use toolshield_core::{ToolRequest, ToolResponse};
    use toolshield_test::call_now;
    use tower::{service_fn, Layer};

    use super::*;
    use crate::future::take_thread_spare;
    use crate::{BreakerConfig, BreakerLayer};

    /// A tool whose calls never finish (wrapped in `service_fn`): the call's future holds
    /// its reference as long as the test keeps it.
    fn hangs(_req: ToolRequest) -> Pending<Result<ToolResponse, ToolError>> {
        pending()
    }

    /// A tool that answers at once.
    fn answers(_req: ToolRequest) -> Ready<Result<ToolResponse, ToolError>> {
        ready(Ok(ToolResponse::new(json!(true))))
    }

    fn request(tool: &str) -> ToolRequest {
        ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly)
    }

    #[test]
    fn a_thread_calling_one_breaker_again_writes_no_reference_count() {
        let _ = take_thread_spare();
        let registry = BreakerRegistry::default();
        let layer = BreakerLayer::new(registry.clone());
        let mut quick = layer.layer(service_fn(answers));
        let mut slow = layer.layer(service_fn(hangs));
        drop(slow.call(request("weather"))); // `slow` now caches the breaker too
        assert!(call_now(&mut quick, request("weather")).is_ok());
        let state = registry.get_or_insert("weather");
        let held = Arc::strong_count(&state);

        // The call in flight holds the reference the last finished call left: no new one.
        let in_flight = slow.call(request("weather"));
        assert_eq!(Arc::strong_count(&state), held);
        // Dropped unfinished, its reference goes with it; the next call clones one, and
        // leaves it behind when it finishes.
        drop(in_flight);
        assert_eq!(Arc::strong_count(&state), held - 1);
        for _ in 0..3 {
            assert!(call_now(&mut quick, request("weather")).is_ok());
            assert_eq!(Arc::strong_count(&state), held);
        }
        // A call on another breaker (through another service, which caches that one)
        // leaves its own reference, and frees this one's.
        let mut other = layer.layer(service_fn(answers));
        assert!(call_now(&mut other, request("search")).is_ok());
        assert_eq!(Arc::strong_count(&state), held - 1);
        let spare = take_thread_spare().expect("the last call's breaker");
        assert_eq!(&*spare.key, "search");
    }

    #[test]
    fn a_breaker_the_registry_does_not_hold_is_never_kept_by_the_thread() {
        let _ = take_thread_spare();
        let registry = BreakerRegistry::new(BreakerConfig {
            max_keys: 1,
            ..BreakerConfig::default()
        })
        .unwrap();
        registry.force_open("held");
        let mut svc = BreakerLayer::new(registry.clone()).layer(service_fn(answers));
        // The registry is full of an unevictable breaker: "other" runs under the shared
        // overflow breaker, which the registry does not hold for it.
        assert!(call_now(&mut svc, request("other")).is_ok());
        assert!(registry.status("other").is_none());
        assert!(take_thread_spare().is_none());
        // A rejected call gives its breaker back as a finished one does.
        assert!(call_now(&mut svc, request("held")).is_err());
        let spare = take_thread_spare().expect("the rejected call's breaker");
        assert_eq!(&*spare.key, "held");
    }

    #[test]
    fn the_breaker_a_thread_keeps_goes_when_the_thread_finishes_a_call_on_another() {
        let _ = take_thread_spare();
        let registry = BreakerRegistry::default();
        let mut svc = BreakerLayer::new(registry.clone()).layer(service_fn(answers));
        assert!(call_now(&mut svc, request("weather")).is_ok());
        let weather = Arc::downgrade(&registry.get_or_insert("weather"));
        drop((svc, registry));
        // The registry's last handle is gone; the thread still holds the breaker its
        // last call finished on, and nothing else does.
        assert!(weather.upgrade().is_some());
        let other = BreakerRegistry::default();
        let mut svc = BreakerLayer::new(other).layer(service_fn(answers));
        assert!(call_now(&mut svc, request("weather")).is_ok());
        assert!(weather.upgrade().is_none(), "replaced, and freed with it");
    }

    #[test]
    fn a_pinned_service_called_with_another_key_uses_that_keys_breaker() {
        let registry = BreakerRegistry::default();
        let mut svc = BreakerLayer::new(registry.clone())
            .pin_key("weather")
            .layer(service_fn(hangs));
        let pinned = registry.pinned("weather");
        assert!(Arc::ptr_eq(svc.cached.as_ref().unwrap(), &pinned));
        let call = svc.call(request("search"));
        assert!(
            registry.status("search").is_some(),
            "looked up by its own key"
        );
        drop(call);
        // Back to the pinned key: its breaker again.
        drop(svc.call(request("weather")));
        assert!(Arc::ptr_eq(svc.cached.as_ref().unwrap(), &pinned));
    }
}
