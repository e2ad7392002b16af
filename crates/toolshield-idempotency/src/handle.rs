//! The layer's handle: counters for the metrics layer, and `forget` for reconciliation.

use std::sync::Arc;

use toolshield_store::LayerState;

use toolshield_core::{ToolError, ToolRequest};

use crate::config::IdempotencyConfig;
use crate::key::{check_key_parts, resolve, storage_key};
use crate::store::{IdempotencyRecord, IdempotencyStore};

toolshield_store::counters! {
    /// Counters shared by every clone of a layer and its services.
    pub(crate) struct Counters;
    /// A snapshot of the idempotency counters (the metrics layer exports `replays` as
    /// `idempotency_cache_hits_total`).
    pub struct IdempotencyCounts {
        /// Calls that claimed a key and ran the tool.
        executions,
        /// Duplicates answered from a COMPLETED or FAILED record (the tool did not run).
        replays,
        /// Duplicates that waited for a PENDING call.
        waits,
        /// Duplicates rejected with `IN_PROGRESS` (fail-fast, or wait bound reached).
        in_progress,
        /// Keys reused with another payload (`IDEMPOTENCY_KEY_REUSED`).
        conflicts,
        /// Calls that ended `OUTCOME_UNKNOWN`.
        outcome_unknown,
        /// Store operations that failed.
        store_errors,
        /// Claims taken over from an owner whose lease had expired without an outcome.
        takeovers,
        /// Calls that ran but whose result could not be recorded (`provenance.unrecorded`).
        unrecorded,
    }
}

pub(crate) struct Shared {
    pub(crate) config: IdempotencyConfig,
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) counters: Counters,
}

impl LayerState for Shared {
    type Counts = IdempotencyCounts;

    fn counts(&self) -> IdempotencyCounts {
        self.counters.snapshot()
    }
}

toolshield_store::store_handle! {
    /// A handle on a layer's state: counters, and records by hand. Cheap to clone.
    pub struct IdempotencyHandle(Shared) -> IdempotencyCounts;
}

impl IdempotencyHandle {
    /// The storage key of the record the layer uses for `req` (given or derived key,
    /// scoped by caller as configured), or `None` when the layer would not dedupe it.
    pub fn key_for(&self, req: &ToolRequest) -> Result<Option<String>, ToolError> {
        let c = &self.0.state().config;
        Ok(
            resolve(req, c.derive_keys, c.key_window, c.scope_keys_by_caller)?
                .map(|k| k.storage_key(req.tool())),
        )
    }

    /// The storage key of a given `key` of `tool`, for `caller` (or for calls without a
    /// caller) as the layer's caller scoping says; whitespace around the key is not part
    /// of it, as for the layer.
    /// Names too long to be part of a storage key are `INVALID_INPUT`, as for the layer:
    /// nothing is sent to the store.
    fn given_key(&self, tool: &str, caller: Option<&str>, key: &str) -> Result<String, ToolError> {
        let caller = caller.filter(|_| self.0.state().config.scope_keys_by_caller);
        check_key_parts(tool, caller, Some(key.trim()))?;
        Ok(storage_key(tool, caller, key))
    }

    /// The record of the given idempotency `key` of `tool`, sent by `caller` (`None` for
    /// calls without a caller), if any. Whitespace around `key` is ignored, as the layer
    /// ignores it.
    pub async fn record(
        &self,
        tool: &str,
        caller: Option<&str>,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, ToolError> {
        let skey = self.given_key(tool, caller, key)?;
        Ok(self.0.state().store.get(&skey).await?)
    }

    /// The record `req` would use, if any.
    pub async fn record_for(
        &self,
        req: &ToolRequest,
    ) -> Result<Option<IdempotencyRecord>, ToolError> {
        match self.key_for(req)? {
            Some(skey) => Ok(self.0.state().store.get(&skey).await?),
            None => Ok(None),
        }
    }

    /// Clears the record of the given idempotency `key` of `tool` sent by `caller`,
    /// whatever its state (after reconciling an `OUTCOME_UNKNOWN`, say). `Ok(true)` when
    /// there was one.
    pub async fn forget(
        &self,
        tool: &str,
        caller: Option<&str>,
        key: &str,
    ) -> Result<bool, ToolError> {
        let skey = self.given_key(tool, caller, key)?;
        Ok(self.0.state().store.remove(&skey).await?)
    }

    /// Clears the record `req` would use.
    pub async fn forget_request(&self, req: &ToolRequest) -> Result<bool, ToolError> {
        match self.key_for(req)? {
            Some(skey) => Ok(self.0.state().store.remove(&skey).await?),
            None => Ok(false),
        }
    }
}
