//! Counters and the handle of a cache layer.

use std::sync::Arc;

use toolshield_core::ToolError;
use toolshield_store::LayerState;

use crate::flight::Flights;
use crate::store::CacheStore;

toolshield_store::counters! {
    /// Counters shared by every clone of a layer and its services.
    pub(crate) struct Counters;
    /// A snapshot of the cache counters. (The metrics layer counts
    /// `tool_cache_hits_total` and `tool_cache_misses_total` itself, per call, from
    /// each answer's provenance.)
    pub struct CacheCounts {
        /// Fresh entries served.
        hits,
        /// Misses that ran the tool (single-flight leaders).
        misses,
        /// Misses that waited for a concurrent identical call and shared its result.
        coalesced,
        /// Stale entries served because the tool failed (stale-if-error).
        stale,
        /// Store operations that failed (the call went on without the cache).
        store_errors,
    }
}

/// What every layer sharing a store shares: the store, the single-flight table, the
/// counters. Each layer adds its own policy.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn CacheStore>,
    pub(crate) flights: Flights,
    pub(crate) counters: Counters,
}

impl LayerState for Shared {
    type Counts = CacheCounts;

    fn counts(&self) -> CacheCounts {
        self.counters.snapshot()
    }
}

toolshield_store::store_handle! {
    /// A handle on a cache layer: counters and invalidation. Cheap to clone.
    pub struct CacheHandle(Shared) -> CacheCounts;
}

impl CacheHandle {
    /// Deletes the entry under a storage key (see [`storage_key`](crate::storage_key)).
    pub async fn invalidate(&self, key: &str) -> Result<bool, ToolError> {
        Ok(self.0.state().store.remove(key).await?)
    }
}
