//! [`CacheLayer`]: configuration and shared state.

use std::sync::Arc;

use toolshield_core::ConfigError;
use tower_layer::Layer;

use crate::config::CacheConfig;
use crate::flight::Flights;
use crate::handle::{CacheHandle, Counters, Shared};
use crate::memory::InMemoryCacheStore;
use crate::service::Cache;
use crate::store::CacheStore;

/// Caches the results of `ReadOnly` calls; other calls pass through untouched.
///
/// Every service the layer builds shares one store, one single-flight table and one set
/// of counters.
#[derive(Clone)]
pub struct CacheLayer {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for CacheLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheLayer")
            .field("config", &self.shared.config)
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
                policies: config
                    .tools
                    .keys()
                    .map(|tool| (Box::from(tool.as_str()), config.policy_for(tool)))
                    .collect(),
                config,
                store,
                flights: Flights::default(),
                counters: Counters::default(),
            }),
        })
    }

    /// The handle: counters and invalidation.
    pub fn handle(&self) -> CacheHandle {
        CacheHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.shared.config
    }
}

impl<S> Layer<S> for CacheLayer {
    type Service = Cache<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Cache::new(inner, self.clone())
    }
}
