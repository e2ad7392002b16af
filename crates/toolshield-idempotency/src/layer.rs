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
    // Whether the stack below marks each attempt as it reaches the tool
    // ([`with_attempt_marks`](Self::with_attempt_marks)).
    pub(crate) attempt_marks: bool,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .field("attempt_marks", &self.attempt_marks)
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
            attempt_marks: false,
        })
    }

    /// Tells the layer that the stack below it marks each attempt as it reaches the tool
    /// ([`CallState::mark_started`](toolshield_core::CallState::mark_started):
    /// `toolshield_provenance::AttemptProvenanceLayer` right above the tool does, and so
    /// do a fallback tier and an injected fault). The stacks the shield builds are marked.
    ///
    /// With the marks, a `Mutating` call that ends before any attempt reached the tool
    /// (dropped or cancelled while it waited in a bulkhead's queue or for a rate
    /// limiter's turn, or while a retry waited after attempts that were all refused; a
    /// `TIMEOUT` before it was sent) ran nothing: its key is
    /// freed, as after a refusal, and a waiting duplicate or a later call runs it. Without
    /// them (the default) the layer cannot tell a call still queued from one already
    /// sent, and keeps any such call `OUTCOME_UNKNOWN`.
    ///
    /// Say so only for a stack that marks every way to the tool: an attempt that reaches
    /// it unmarked and is then dropped would free a key whose work may have run. The call
    /// must also stay on the caller's task between this layer and the mark (no `Buffer`,
    /// no spawned attempt), so that a dropped call cannot reach the tool later.
    #[must_use]
    pub fn with_attempt_marks(mut self) -> Self {
        self.attempt_marks = true;
        self
    }

    /// Whether the layer was told that the stack below marks its attempts
    /// ([`with_attempt_marks`](Self::with_attempt_marks)).
    pub fn attempt_marks(&self) -> bool {
        self.attempt_marks
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
