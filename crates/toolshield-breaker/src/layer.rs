//! [`BreakerLayer`]: configuration only.

use std::fmt;
use std::sync::Arc;

use toolshield_contract::{ConfigError, DefaultClassifier};
use tower_layer::Layer;

use crate::config::BreakerConfig;
use crate::key::ToolKey;
use crate::registry::BreakerRegistry;
use crate::service::Breaker;
use crate::state::BreakerState;

/// The breaker of a pinned key, as the layer holds it.
#[derive(Clone)]
struct Pinned(Arc<BreakerState>);

impl fmt::Debug for Pinned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pinned").field(&self.0.key).finish()
    }
}

/// Wraps a service in [`Breaker`]: per-key circuit breakers from one
/// [`BreakerRegistry`].
///
/// Every service this layer builds, and every clone of them, shares the registry: the
/// breaker of a key is one breaker, whichever service the call went through.
#[derive(Debug, Clone)]
pub struct BreakerLayer<K = ToolKey, C = DefaultClassifier> {
    registry: BreakerRegistry,
    key_fn: K,
    classifier: C,
}

impl BreakerLayer {
    /// A layer over `registry`, keyed by tool name, with the default classifier.
    #[must_use]
    pub fn new(registry: BreakerRegistry) -> Self {
        BreakerLayer {
            registry,
            key_fn: ToolKey,
            classifier: DefaultClassifier,
        }
    }

    /// A layer over a new registry built from `config` (every problem reported).
    pub fn from_config(config: &BreakerConfig) -> Result<Self, ConfigError> {
        Ok(Self::new(BreakerRegistry::new(config.clone())?))
    }
}

impl<K, C> BreakerLayer<K, C> {
    /// Keys breakers with `key_fn` instead (see [`key_fn`](crate::key_fn)).
    #[must_use]
    pub fn key_fn<K2>(self, key_fn: K2) -> BreakerLayer<K2, C> {
        BreakerLayer {
            registry: self.registry,
            key_fn,
            classifier: self.classifier,
        }
    }

    /// Classifies results with `classifier` instead. It is cloned into every response
    /// future: keep it cheap to clone (a unit struct, a closure, an `Arc`).
    #[must_use]
    pub fn classifier<C2>(self, classifier: C2) -> BreakerLayer<K, C2> {
        BreakerLayer {
            registry: self.registry,
            key_fn: self.key_fn,
            classifier,
        }
    }

    /// For a layer that wraps calls of one known key (a stack built for one tool): the
    /// services it builds, and every clone of them, start with that key's breaker in hand,
    /// so a call with that key does no lookup in the registry, even on a clone of a service
    /// that never ran (as a service cloned for every call is). The breaker is created now
    /// if the registry has none, whatever its `max_keys`, and is never evicted for being
    /// idle: pin keys the application chose, never ones taken from a request. Calls with
    /// another key look it up as usual.
    #[must_use]
    pub fn pin_key(self, key: &str) -> PinnedBreakerLayer<K, C> {
        let pinned = Pinned(self.registry.pinned(key));
        PinnedBreakerLayer {
            layer: self,
            pinned,
        }
    }

    /// The registry: status, overrides, events.
    pub fn registry(&self) -> &BreakerRegistry {
        &self.registry
    }
}

impl<S, K: Clone, C: Clone> Layer<S> for BreakerLayer<K, C> {
    type Service = Breaker<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Breaker::new(
            inner,
            self.registry.clone(),
            self.key_fn.clone(),
            self.classifier.clone(),
        )
    }
}

/// A [`BreakerLayer`] for one known key ([`BreakerLayer::pin_key`]): each service it
/// builds starts with the key's breaker in hand. Calls with another key look that key up
/// as usual.
#[derive(Debug, Clone)]
pub struct PinnedBreakerLayer<K = ToolKey, C = DefaultClassifier> {
    layer: BreakerLayer<K, C>,
    pinned: Pinned,
}

impl<K, C> PinnedBreakerLayer<K, C> {
    /// The registry: status, overrides, events.
    pub fn registry(&self) -> &BreakerRegistry {
        &self.layer.registry
    }
}

impl<S, K: Clone, C: Clone> Layer<S> for PinnedBreakerLayer<K, C> {
    type Service = Breaker<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        let l = &self.layer;
        Breaker::new(
            inner,
            l.registry.clone(),
            l.key_fn.clone(),
            l.classifier.clone(),
        )
        .with_cached(Some(Arc::clone(&self.pinned.0)))
    }
}

impl Default for BreakerLayer {
    /// A layer over a new registry with the default configuration.
    fn default() -> Self {
        Self::new(BreakerRegistry::default())
    }
}
