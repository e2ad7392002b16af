//! [`CacheLayer`]: configuration and shared state.

use std::sync::Arc;

use toolshield_core::ConfigError;
use toolshield_store::StoreHandle;
use tower_layer::Layer;

use crate::config::CacheConfig;
use crate::flight::Flights;
use crate::handle::{CacheHandle, Counters, Shared};
use crate::memory::InMemoryCacheStore;
use crate::service::Cache;
use crate::store::CacheStore;

/// Caches the results of `ReadOnly` calls under one policy ([`CacheConfig`]); other
/// calls pass through untouched.
///
/// The layers made from one another with [`with_config`](Self::with_config) share one
/// store, one single-flight table and one set of counters, each with its own policy: the
/// facade builds one per tool, so a call finds its policy in the layer that wraps its tool,
/// never by looking its name up.
#[derive(Clone)]
pub struct CacheLayer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) config: CacheConfig,
}

impl std::fmt::Debug for CacheLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl CacheLayer {
    /// A layer with `config` over a fresh [`InMemoryCacheStore`] (default bounds).
    pub fn new(config: CacheConfig) -> Result<Self, ConfigError> {
        Self::with_store(config, Arc::new(InMemoryCacheStore::new()))
    }

    /// A layer with `config` over `store`.
    pub fn with_store(
        config: CacheConfig,
        store: Arc<dyn CacheStore>,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(CacheLayer {
            shared: Arc::new(Shared {
                store,
                flights: Flights::default(),
                counters: Counters::default(),
            }),
            config,
        })
    }

    /// A layer with another policy sharing this one's store, single-flight table and
    /// counters (the cache of another tool).
    pub fn with_config(&self, config: CacheConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(CacheLayer {
            shared: Arc::clone(&self.shared),
            config,
        })
    }

    /// The handle: counters and invalidation.
    pub fn handle(&self) -> CacheHandle {
        CacheHandle(StoreHandle::new(Arc::clone(&self.shared)))
    }

    /// The policy.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }
}

impl<S> Layer<S> for CacheLayer {
    type Service = Cache<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Cache::new(inner, self.clone())
    }
}
