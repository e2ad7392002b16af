//! The bounded in-memory [`CacheStore`]: sharded maps with CLOCK eviction.

use std::future::ready;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use toolshield_core::config::{ConfigError, Problems};
use toolshield_core::hash::{FastHashMap, FastState};
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

/// At most this many shards; fewer when `max_entries` is smaller, so that every shard
/// holds at least one entry.
const MAX_SHARDS: usize = 16;

/// One cached response.
struct Entry {
    key: Arc<str>,
    response: Arc<ToolResponse>,
    /// Checked against tokio's clock, so paused-clock tests see entries expire.
    deadline: Instant,
    weight: u64,
    /// Set by every read, cleared by the clock hand: a read entry gets a second chance.
    referenced: AtomicBool,
}

/// A part of the store with its own lock and its own share of both bounds.
struct Shard {
    index: FastHashMap<Arc<str>, usize>,
    /// The clock: entries in insertion slots, `None` for a free slot.
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    hand: usize,
    bytes: u64,
    max_entries: usize,
    max_bytes: u64,
}

impl Shard {
    fn new(max_entries: usize, max_bytes: u64) -> Self {
        Shard {
            index: FastHashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            bytes: 0,
            max_entries,
            max_bytes,
        }
    }

    fn remove_at(&mut self, pos: usize) -> Option<Entry> {
        let entry = self.slots.get_mut(pos)?.take()?;
        self.index.remove(&entry.key);
        self.bytes -= entry.weight;
        self.free.push(pos);
        Some(entry)
    }

    fn remove(&mut self, key: &str) -> Option<Entry> {
        let pos = *self.index.get(key)?;
        self.remove_at(pos)
    }

    /// Evicts until one more entry of `weight` bytes fits: expired entries first as the
    /// hand meets them, then entries not read since the hand last passed (CLOCK).
    fn make_room(&mut self, weight: u64, now: Instant) {
        while !self.index.is_empty()
            && (self.index.len() >= self.max_entries || self.bytes + weight > self.max_bytes)
        {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let pos = self.hand;
            self.hand += 1;
            let evict = match &self.slots[pos] {
                None => false,
                Some(e) if now >= e.deadline => true,
                Some(e) => !e.referenced.swap(false, Ordering::Relaxed),
            };
            if evict {
                self.remove_at(pos);
            }
        }
    }

    fn insert(&mut self, entry: Entry) {
        self.bytes += entry.weight;
        let key = Arc::clone(&entry.key);
        let pos = match self.free.pop() {
            Some(pos) => {
                self.slots[pos] = Some(entry);
                pos
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        };
        self.index.insert(key, pos);
    }

    fn purge_expired(&mut self, now: Instant) {
        for pos in 0..self.slots.len() {
            if self.slots[pos].as_ref().is_some_and(|e| now >= e.deadline) {
                self.remove_at(pos);
            }
        }
    }
}

struct Inner {
    shards: Box<[RwLock<Shard>]>,
    hasher: FastState,
}

/// A [`CacheStore`] in the memory of one process.
///
/// Bounded by entries and by bytes, each entry weighing its key plus its output's compact
/// JSON length plus its provenance record ([`response_weight`]). Both bounds hold after
/// every write: a write first evicts what it needs to fit. The keys are spread over up to
/// 16 shards, each with its own lock and an equal share of both bounds (so a skewed key
/// set may evict a little before the totals are reached).
///
/// Eviction is CLOCK (second chance): every read marks its entry, the clock hand clears
/// marks and evicts the first entry it finds unmarked, or expired. An entry read at least
/// once per turn of the hand survives any flood of one-off keys. TTL is per entry and
/// checked on every read against tokio's clock. Clones share the entries.
#[derive(Clone)]
pub struct InMemoryCacheStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for InMemoryCacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryCacheStore")
            .field("shards", &self.inner.shards.len())
            .field("entries", &self.entry_count())
            .field("weighted_size", &self.weighted_size())
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
        let max_entries = usize::try_from(config.max_entries.max(1)).unwrap_or(usize::MAX);
        // A power of two no larger than the entry bound: each shard holds at least one.
        let shards = if max_entries >= MAX_SHARDS {
            MAX_SHARDS
        } else {
            1 << max_entries.ilog2()
        };
        let per_shard_entries = max_entries / shards;
        let per_shard_bytes = (config.max_bytes.max(1) / shards as u64).max(1);
        InMemoryCacheStore {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| RwLock::new(Shard::new(per_shard_entries, per_shard_bytes)))
                    .collect(),
                hasher: FastState::default(),
            }),
        }
    }

    fn shard(&self, key: &str) -> &RwLock<Shard> {
        let shards = &self.inner.shards;
        // `shards.len()` is a power of two.
        let h = self.inner.hasher.hash_one(key) as usize;
        &shards[h & (shards.len() - 1)]
    }

    fn read(shard: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
        shard.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(shard: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
        shard.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The number of entries, expired ones not yet evicted included.
    pub fn entry_count(&self) -> u64 {
        self.inner
            .shards
            .iter()
            .map(|s| Self::read(s).index.len() as u64)
            .sum()
    }

    /// The weighted size in bytes of the entries [`entry_count`](Self::entry_count) counts.
    pub fn weighted_size(&self) -> u64 {
        self.inner.shards.iter().map(|s| Self::read(s).bytes).sum()
    }

    /// Frees every expired entry now (otherwise they go when read, or when the clock hand
    /// meets them).
    pub fn purge_expired(&self) {
        let now = Instant::now();
        for shard in self.inner.shards.iter() {
            Self::write(shard).purge_expired(now);
        }
    }

    /// The live entry under `key`, without a future (what [`CacheStore::get`] does).
    pub fn get_now(&self, key: &str) -> Option<CacheLookup> {
        let now = Instant::now();
        let shard = self.shard(key);
        let (response, deadline) =
            {
                let guard = Self::read(shard);
                let pos = *guard.index.get(key)?;
                let entry = guard.slots.get(pos)?.as_ref()?;
                if now >= entry.deadline {
                    None
                } else {
                    entry.referenced.store(true, Ordering::Relaxed);
                    Some((Arc::clone(&entry.response), entry.deadline))
                }
            }
            .or_else(|| {
                // Expired: free it now rather than when the hand comes round.
                let mut guard = Self::write(shard);
                if guard.index.get(key).is_some_and(|&pos| {
                    guard.slots[pos].as_ref().is_some_and(|e| now >= e.deadline)
                }) {
                    guard.remove(key);
                }
                None
            })?;
        Some(CacheLookup {
            response: (*response).clone(),
            ttl_left: deadline - now,
        })
    }

    /// Stores `response` under `key` for `ttl`, without a future. A response heavier than
    /// a shard's share of `max_bytes` is not stored (and replaces no older entry).
    pub fn put_now(&self, key: &str, mut response: ToolResponse, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        response.extensions = Default::default();
        let weight = key.len().saturating_add(response_weight(&response)) as u64;
        let now = Instant::now();
        let shard = self.shard(key);
        let mut guard = Self::write(shard);
        // The old entry goes first, whatever happens to the new one: never serve a
        // response older than the one just written.
        guard.remove(key);
        if weight > guard.max_bytes {
            return;
        }
        guard.make_room(weight, now);
        guard.insert(Entry {
            key: Arc::from(key),
            response: Arc::new(response),
            deadline: now + ttl,
            weight,
            referenced: AtomicBool::new(false),
        });
    }

    /// Deletes the entry under `key`, without a future; `true` if a live entry was there.
    pub fn remove_now(&self, key: &str) -> bool {
        let now = Instant::now();
        Self::write(self.shard(key))
            .remove(key)
            .is_some_and(|e| now < e.deadline)
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
