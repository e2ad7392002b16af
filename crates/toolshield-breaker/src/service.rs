//! [`Breaker`]: the service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use toolshield_contract::{
    Classify, DefaultClassifier, ErrorKind, ShieldRequest, ShieldResponse, ToolError,
};
use tower_service::Service;

use crate::events::CircuitState;
use crate::future::{CallGuard, ResponseFuture};
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

    #[inline]
    fn lookup(
        registry: &BreakerRegistry,
        cached: &mut Option<Arc<BreakerState>>,
        key: &str,
    ) -> Arc<BreakerState> {
        if let Some(s) = cached {
            if &*s.key == key && s.touch() {
                return Arc::clone(s);
            }
        }
        let s = registry.get_or_insert(key);
        *cached = Some(Arc::clone(&s));
        s
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
    S::Error: Into<ToolError>,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
    K: KeyFn<Req>,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let key = self.key_fn.key(&req);
        let state = Self::lookup(&self.registry, &mut self.cached, &key);
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
        let guard = CallGuard::new(state, ticket, slow_check);
        ResponseFuture::called(self.inner.call(req), guard, self.classifier.clone())
    }
}
