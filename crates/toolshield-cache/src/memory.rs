//! The bounded in-memory [`CacheStore`], on the shared [`TtlMap`].

use std::future::ready;
use std::time::Duration;

use toolshield_core::config::ConfigError;
use toolshield_core::size::response_weight;
use toolshield_core::ToolResponse;
use toolshield_store::{MemoryBounds, TtlMap};

use crate::store::{CacheLookup, CacheStore, StoreFuture};

/// A [`CacheStore`] in the memory of one process: a [`TtlMap`] of responses.
///
/// Bounded by entries and by bytes ([`MemoryBounds`]), each entry weighing its key plus
/// its output's compact JSON length plus its provenance record ([`response_weight`]).
/// Both bounds hold after every write; eviction is CLOCK (second chance), so an entry read
/// at least once per turn of the hand survives any flood of one-off keys; TTL is per entry
/// and checked on every read against tokio's clock (see [`TtlMap`]). Clones share the
/// entries.
#[derive(Clone, Debug)]
pub struct InMemoryCacheStore {
    entries: TtlMap<ToolResponse>,
}

impl Default for InMemoryCacheStore {
    fn default() -> Self {
        InMemoryCacheStore {
            entries: TtlMap::new(Self::DEFAULT_BOUNDS),
        }
    }
}

impl InMemoryCacheStore {
    /// The bounds of [`new`](Self::new): 10,000 entries, 64 MiB.
    pub const DEFAULT_BOUNDS: MemoryBounds = MemoryBounds::new(10_000, 64 * 1024 * 1024);

    /// A store with the default bounds ([`DEFAULT_BOUNDS`](Self::DEFAULT_BOUNDS)).
    pub fn new() -> Self {
        Self::default()
    }

    /// A store with `bounds`; invalid bounds are an error.
    pub fn with_config(bounds: &MemoryBounds) -> Result<Self, ConfigError> {
        Ok(InMemoryCacheStore {
            entries: TtlMap::with_bounds(*bounds)?,
        })
    }

    /// The entries: their count, weighted size, and `purge_expired`.
    pub fn entries(&self) -> &TtlMap<ToolResponse> {
        &self.entries
    }

    /// The live entry under `key`, without a future (what [`CacheStore::get`] does).
    pub fn get_now(&self, key: &str) -> Option<CacheLookup> {
        // Copied under the shard's read lock (readers do not wait for each other): no
        // reference count taken and dropped per hit.
        let (response, ttl_left) = self
            .entries
            .get(key, |response, left| (ToolResponse::clone(response), left))?;
        Some(CacheLookup { response, ttl_left })
    }

    /// Stores `response` under `key` for `ttl`, without a future. A response heavier than
    /// a shard's share of `max_bytes` is not stored (and the older entry is removed).
    pub fn put_now(&self, key: &str, mut response: ToolResponse, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        response.extensions = Default::default();
        let weight = key.len().saturating_add(response_weight(&response)) as u64;
        // Kept as it is, not behind an `Arc`: a hit copies it out under the read lock
        // anyway, and an entry is one allocation fewer to make on a miss and to free on
        // an eviction (often on another worker than the one that made it).
        self.entries.insert(key, response, weight, ttl);
    }

    /// Deletes the entry under `key`, without a future; `true` if a live entry was there.
    pub fn remove_now(&self, key: &str) -> bool {
        self.entries.remove(key)
    }
}

impl CacheStore for InMemoryCacheStore {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<CacheLookup>> {
        Box::pin(ready(Ok(self.get_now(key))))
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        response: ToolResponse,
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        self.put_now(key, response, ttl);
        Box::pin(ready(Ok(())))
    }

    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(ready(Ok(self.remove_now(key))))
    }

    fn lookup_now(&self, key: &str) -> Option<CacheLookup> {
        self.get_now(key)
    }

    fn answers_now(&self) -> bool {
        true
    }

    fn try_put_now(
        &self,
        key: &str,
        response: ToolResponse,
        ttl: Duration,
    ) -> Result<(), ToolResponse> {
        self.put_now(key, response, ttl);
        Ok(())
    }
}
