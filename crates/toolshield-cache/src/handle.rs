//! Counters and the handle of a cache layer.

use std::sync::Arc;

use toolshield_core::ToolError;
use toolshield_store::Counter;

use crate::flight::Flights;
use crate::store::CacheStore;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) hits: Counter,
    pub(crate) misses: Counter,
    pub(crate) coalesced: Counter,
    pub(crate) stale: Counter,
    pub(crate) store_errors: Counter,
}

/// A snapshot of the cache counters (exported as `tool_cache_hits_total` and
/// `tool_cache_misses_total` by the metrics layer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheCounts {
    /// Fresh entries served.
    pub hits: u64,
    /// Misses that ran the tool (single-flight leaders).
    pub misses: u64,
    /// Misses that waited for a concurrent identical call and shared its result.
    pub coalesced: u64,
    /// Stale entries served because the tool failed (stale-if-error).
    pub stale: u64,
    /// Store operations that failed (the call went on without the cache).
    pub store_errors: u64,
}

/// What every layer sharing a store shares: the store, the single-flight table, the
/// counters. Each layer adds its own policy.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn CacheStore>,
    pub(crate) flights: Flights,
    pub(crate) counters: Counters,
}

/// A handle on a cache layer: counters and invalidation. Cheap to clone.
#[derive(Clone)]
pub struct CacheHandle {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for CacheHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheHandle")
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

impl CacheHandle {
    /// The counters now.
    pub fn counts(&self) -> CacheCounts {
        let c = &self.shared.counters;
        CacheCounts {
            hits: c.hits.get(),
            misses: c.misses.get(),
            coalesced: c.coalesced.get(),
            stale: c.stale.get(),
            store_errors: c.store_errors.get(),
        }
    }

    /// Deletes the entry under a storage key (see [`storage_key`](crate::storage_key)).
    pub async fn invalidate(&self, key: &str) -> Result<bool, ToolError> {
        Ok(self.shared.store.remove(key).await?)
    }
}
