//! The layer's handle: counters for the metrics layer, and `forget` for reconciliation.

use std::sync::Arc;

use toolshield_store::Counter;

use toolshield_core::{ToolError, ToolRequest};

use crate::config::IdempotencyConfig;
use crate::key::{resolve, storage_key};
use crate::store::{IdempotencyRecord, IdempotencyStore};

/// Counters shared by every clone of a layer and its services.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) executions: Counter,
    pub(crate) replays: Counter,
    pub(crate) waits: Counter,
    pub(crate) in_progress: Counter,
    pub(crate) conflicts: Counter,
    pub(crate) outcome_unknown: Counter,
    pub(crate) store_errors: Counter,
    pub(crate) takeovers: Counter,
    pub(crate) unrecorded: Counter,
}

/// A snapshot of the idempotency counters (the metrics layer exports `replays` as
/// `idempotency_cache_hits_total`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdempotencyCounts {
    /// Calls that claimed a key and ran the tool.
    pub executions: u64,
    /// Duplicates answered from a COMPLETED or FAILED record (the tool did not run).
    pub replays: u64,
    /// Duplicates that waited for a PENDING call.
    pub waits: u64,
    /// Duplicates rejected with `IN_PROGRESS` (fail-fast, or wait bound reached).
    pub in_progress: u64,
    /// Keys reused with another payload (`IDEMPOTENCY_KEY_REUSED`).
    pub conflicts: u64,
    /// Calls that ended `OUTCOME_UNKNOWN`.
    pub outcome_unknown: u64,
    /// Store operations that failed.
    pub store_errors: u64,
    /// Claims taken over from an owner whose lease had expired without an outcome.
    pub takeovers: u64,
    /// Calls that ran but whose result could not be recorded (`provenance.unrecorded`).
    pub unrecorded: u64,
}

pub(crate) struct Shared {
    pub(crate) config: IdempotencyConfig,
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) counters: Counters,
}

/// A handle on a layer's state: counters, and records by hand. Cheap to clone.
#[derive(Clone)]
pub struct IdempotencyHandle {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for IdempotencyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyHandle")
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

impl IdempotencyHandle {
    /// The counters now.
    pub fn counts(&self) -> IdempotencyCounts {
        let c = &self.shared.counters;
        IdempotencyCounts {
            executions: c.executions.get(),
            replays: c.replays.get(),
            waits: c.waits.get(),
            in_progress: c.in_progress.get(),
            conflicts: c.conflicts.get(),
            outcome_unknown: c.outcome_unknown.get(),
            store_errors: c.store_errors.get(),
            takeovers: c.takeovers.get(),
            unrecorded: c.unrecorded.get(),
        }
    }

    /// The storage key of the record the layer uses for `req` (given or derived key,
    /// scoped by caller as configured), or `None` when the layer would not dedupe it.
    pub fn key_for(&self, req: &ToolRequest) -> Result<Option<String>, ToolError> {
        let c = &self.shared.config;
        Ok(
            resolve(req, c.derive_keys, c.key_window, c.scope_keys_by_caller)?
                .map(|k| k.storage_key(req.tool())),
        )
    }

    /// The storage key of a given `key` of `tool`, for `caller` (or for calls without a
    /// caller) as the layer's caller scoping says.
    fn given_key(&self, tool: &str, caller: Option<&str>, key: &str) -> String {
        let caller = caller.filter(|_| self.shared.config.scope_keys_by_caller);
        storage_key(tool, caller, key)
    }

    /// The record of the given idempotency `key` of `tool`, sent by `caller` (`None` for
    /// calls without a caller), if any.
    pub async fn record(
        &self,
        tool: &str,
        caller: Option<&str>,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, ToolError> {
        let skey = self.given_key(tool, caller, key);
        Ok(self.shared.store.get(&skey).await?)
    }

    /// The record `req` would use, if any.
    pub async fn record_for(
        &self,
        req: &ToolRequest,
    ) -> Result<Option<IdempotencyRecord>, ToolError> {
        match self.key_for(req)? {
            Some(skey) => Ok(self.shared.store.get(&skey).await?),
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
        let skey = self.given_key(tool, caller, key);
        Ok(self.shared.store.remove(&skey).await?)
    }

    /// Clears the record `req` would use.
    pub async fn forget_request(&self, req: &ToolRequest) -> Result<bool, ToolError> {
        match self.key_for(req)? {
            Some(skey) => Ok(self.shared.store.remove(&skey).await?),
            None => Ok(false),
        }
    }
}
