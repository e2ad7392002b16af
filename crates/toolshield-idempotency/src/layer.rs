//! [`IdempotencyLayer`]: configuration and shared state.

use std::sync::Arc;

use toolshield_core::config::Problems;
use toolshield_core::ConfigError;
use toolshield_store::StoreHandle;
use tower_layer::Layer;

use crate::config::IdempotencyConfig;
use crate::handle::{Counters, IdempotencyHandle, Shared};
use crate::memory::InMemoryIdempotencyStore;
use crate::service::Idempotency;
use crate::store::IdempotencyStore;

/// Dedupes `Mutating` and `Idempotent` calls by idempotency key; `ReadOnly` calls pass
/// through untouched.
///
/// Every service the layer builds shares one store, one set of counters and the
/// [`IdempotencyHandle`].
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer with `config` over a fresh [`InMemoryIdempotencyStore`] (default bounds).
    pub fn new(config: IdempotencyConfig) -> Result<Self, ConfigError> {
        Self::with_store(config, Arc::new(InMemoryIdempotencyStore::new()))
    }

    /// A layer with `config` over `store` (shared with whoever else holds it).
    ///
    /// Besides [`IdempotencyConfig::validate`], the lease must be longer than the store's
    /// operation timeout ([`IdempotencyStore::op_timeout`], a Redis store's
    /// `op_timeout`): every problem is listed.
    pub fn with_store(
        config: IdempotencyConfig,
        store: Arc<dyn IdempotencyStore>,
    ) -> Result<Self, ConfigError> {
        let mut p = Problems::new();
        p.extend("", config.validate());
        if let Some(op_timeout) = store.op_timeout() {
            p.check(
                op_timeout < config.lease,
                "lease",
                format_args!(
                    "{:?} must be longer than the store's op_timeout {:?}: a claim or a renewal \
                     could take the whole lease, and another call take the key over while the \
                     first still runs",
                    config.lease, op_timeout
                ),
            );
        }
        p.into_result()?;
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared {
                config,
                store,
                counters: Counters::default(),
            }),
        })
    }

    /// The handle: counters, `record`, `forget`.
    pub fn handle(&self) -> IdempotencyHandle {
        IdempotencyHandle(StoreHandle::new(Arc::clone(&self.shared)))
    }

    /// The configuration.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.shared.config
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, self.clone())
    }
}
