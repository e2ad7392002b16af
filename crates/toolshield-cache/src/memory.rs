//! The bounded in-memory [`CacheStore`], on `moka`.

use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use moka::policy::Expiry;
use moka::sync::Cache;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use toolshield_core::config::{ConfigError, Problems};
use toolshield_core::hash::FastState;
use toolshield_core::size::response_weight;
use toolshield_core::ToolResponse;

use crate::store::{CacheLookup, CacheStore, StoreFuture};

/// Bounds of an in-memory cache store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryCacheConfig {
    /// At most this many entries.
    pub max_entries: u64,
    /// At most about this many bytes (each entry: its key, its output as compact JSON and
    /// its provenance record).
    pub max_bytes: u64,
}

impl Default for MemoryCacheConfig {
    fn default() -> Self {
        MemoryCacheConfig {
            max_entries: 10_000,
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

impl MemoryCacheConfig {
    /// Every problem: both bounds at least 1, and `max_bytes >= max_entries`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check(self.max_entries >= 1, "max_entries", "must be at least 1");
        p.check(self.max_bytes >= 1, "max_bytes", "must be at least 1");
        p.check(
            self.max_bytes >= self.max_entries,
            "max_bytes",
            format_args!(
                "must be at least max_entries ({} < {})",
                self.max_bytes, self.max_entries
            ),
        );
        p.into_result()
    }
}

#[derive(Clone)]
struct Slot {
    response: Arc<ToolResponse>,
    /// Checked on read against tokio's clock (paused-clock tests); moka's own expiry runs
    /// on the real clock and only frees memory.
    deadline: Instant,
    ttl: Duration,
    weight: u32,
}

struct SlotExpiry;

impl Expiry<String, Slot> for SlotExpiry {
    fn expire_after_create(
        &self,
        _k: &String,
        v: &Slot,
        _at: std::time::Instant,
    ) -> Option<Duration> {
        Some(v.ttl)
    }

    fn expire_after_update(
        &self,
        _k: &String,
        v: &Slot,
        _at: std::time::Instant,
        _left: Option<Duration>,
    ) -> Option<Duration> {
        Some(v.ttl)
    }
}

/// A [`CacheStore`] in the memory of one process.
///
/// Bounded by entries and by bytes: a `moka` cache whose weigher gives each entry its key
/// plus its output's compact JSON length plus its provenance record
/// ([`response_weight`]), and at least `max_bytes / max_entries`, so neither bound can be passed.
/// Eviction is moka's TinyLFU (frequently read entries survive a flood of one-off keys),
/// TTL is per entry, and moka is safe under any concurrency. Clones share the entries.
#[derive(Clone)]
pub struct InMemoryCacheStore {
    cache: Cache<String, Slot, FastState>,
    min_weight: u64,
}

impl std::fmt::Debug for InMemoryCacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryCacheStore")
            .field("entries", &self.cache.entry_count())
            .field("weighted_size", &self.cache.weighted_size())
            .finish()
    }
}

impl Default for InMemoryCacheStore {
    fn default() -> Self {
        Self::build(&MemoryCacheConfig::default())
    }
}

impl InMemoryCacheStore {
    /// A store with the default bounds (10,000 entries, 64 MiB).
    pub fn new() -> Self {
        Self::default()
    }

    /// A store with `config`'s bounds; invalid bounds are an error.
    pub fn with_config(config: &MemoryCacheConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::build(config))
    }

    fn build(config: &MemoryCacheConfig) -> Self {
        let min_weight = config.max_bytes.max(1).div_ceil(config.max_entries.max(1));
        let cache = Cache::builder()
            .initial_capacity(
                usize::try_from(config.max_entries)
                    .unwrap_or(usize::MAX)
                    .min(1 << 20)
                    .saturating_mul(2),
            )
            .max_capacity(config.max_bytes.max(1))
            .weigher(|_k: &String, v: &Slot| v.weight)
            .expire_after(SlotExpiry)
            .build_with_hasher(FastState::default());
        InMemoryCacheStore { cache, min_weight }
    }

    /// The number of entries (approximate until [`run_pending_tasks`](Self::run_pending_tasks)).
    pub fn entry_count(&self) -> u64 {
        self.cache.entry_count()
    }

    /// The weighted size in bytes (approximate until [`run_pending_tasks`](Self::run_pending_tasks)).
    pub fn weighted_size(&self) -> u64 {
        self.cache.weighted_size()
    }

    /// Runs the cache's pending maintenance (eviction, expiry) now.
    pub fn run_pending_tasks(&self) {
        self.cache.run_pending_tasks();
    }

    /// The live entry under `key`, without a future (what [`CacheStore::get`] does).
    pub fn get_now(&self, key: &str) -> Option<CacheLookup> {
        let now = Instant::now();
        let slot = self.cache.get(key)?;
        if now >= slot.deadline {
            return None;
        }
        Some(CacheLookup {
            response: (*slot.response).clone(),
            ttl_left: slot.deadline - now,
        })
    }

    /// Stores `response` under `key` for `ttl`, without a future.
    pub fn put_now(&self, key: &str, mut response: ToolResponse, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        response.extensions = Default::default();
        let bytes = key.len().saturating_add(response_weight(&response));
        let weight = (bytes as u64).max(self.min_weight).min(u64::from(u32::MAX));
        let slot = Slot {
            response: Arc::new(response),
            deadline: Instant::now() + ttl,
            ttl,
            weight: u32::try_from(weight).unwrap_or(u32::MAX),
        };
        self.cache.insert(key.to_owned(), slot);
    }

    /// Deletes the entry under `key`, without a future.
    pub fn remove_now(&self, key: &str) -> bool {
        let now = Instant::now();
        self.cache.remove(key).is_some_and(|s| now < s.deadline)
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
}
