//! [`BreakerLayer`]: configuration only.

use toolshield_contract::{ConfigError, DefaultClassifier};
use tower_layer::Layer;

use crate::config::BreakerConfig;
use crate::key::ToolKey;
use crate::registry::BreakerRegistry;
use crate::service::Breaker;

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

impl Default for BreakerLayer {
    /// A layer over a new registry with the default configuration.
    fn default() -> Self {
        Self::new(BreakerRegistry::default())
    }
}
