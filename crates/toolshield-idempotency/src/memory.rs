//! The bounded in-memory [`IdempotencyStore`], on `moka`.

use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use moka::ops::compute::Op;
use moka::policy::{EvictionPolicy, Expiry};
use moka::sync::Cache;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use toolshield_core::config::{ConfigError, Problems};
use toolshield_core::hash::FastState;
use toolshield_core::size::serialized_len;

use crate::store::{ClaimOutcome, IdempotencyRecord, IdempotencyStore, StoreFuture};

/// Bounds of an in-memory store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryStoreConfig {
    /// At most this many records.
    pub max_entries: u64,
    /// At most about this many bytes of records (key + JSON size of the record).
    pub max_bytes: u64,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        MemoryStoreConfig {
            max_entries: 100_000,
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

impl MemoryStoreConfig {
    /// Every problem: both bounds must be at least 1, and `max_bytes >= max_entries`.
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

    /// The weight unit: every entry weighs at least `ceil(max_bytes / max_entries)`, so a
    /// byte budget of `max_bytes` also caps the count at `max_entries`.
    pub(crate) fn min_weight(&self) -> u64 {
        let entries = self.max_entries.max(1);
        self.max_bytes.max(1).div_ceil(entries)
    }
}

#[derive(Clone)]
struct Slot {
    record: Arc<IdempotencyRecord>,
    /// Checked on every read against tokio's clock, so paused-clock tests see expiry
    /// (moka's own expiry runs on the real clock and only frees memory).
    deadline: Instant,
    ttl: Duration,
    weight: u32,
}

impl Slot {
    fn live(&self, now: Instant) -> bool {
        now < self.deadline
    }

    /// How long the map keeps the slot: a PENDING claim stays visible (but not live) for
    /// one more lease after it expires, so the next claim can tell a takeover.
    fn kept_for(&self) -> Duration {
        if self.record.status == crate::store::RecordStatus::Pending {
            self.ttl.saturating_mul(2)
        } else {
            self.ttl
        }
    }
}

struct SlotExpiry;

impl Expiry<String, Slot> for SlotExpiry {
    fn expire_after_create(
        &self,
        _k: &String,
        v: &Slot,
        _at: std::time::Instant,
    ) -> Option<Duration> {
        Some(v.kept_for())
    }

    fn expire_after_update(
        &self,
        _k: &String,
        v: &Slot,
        _at: std::time::Instant,
        _left: Option<Duration>,
    ) -> Option<Duration> {
        Some(v.kept_for())
    }
}

/// An [`IdempotencyStore`] in the memory of one process.
///
/// Bounded by entries and by bytes (a `moka` cache with a weigher: each record weighs its
/// key plus its JSON size, and at least `max_bytes / max_entries`, so neither bound can be
/// passed), with a per-record TTL, and atomic per key (`moka`'s per-key compute lock), so
/// it is safe under any concurrency. Eviction is LRU: under pressure the records touched
/// least recently go first. Dedupe is exact only while the bound holds every live record:
/// size it for the records kept over the record TTL (default 24 h).
///
/// Clones share the same records.
#[derive(Clone)]
pub struct InMemoryIdempotencyStore {
    cache: Cache<String, Slot, FastState>,
    min_weight: u64,
}

impl std::fmt::Debug for InMemoryIdempotencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryIdempotencyStore")
            .field("entries", &self.cache.entry_count())
            .field("weighted_size", &self.cache.weighted_size())
            .finish()
    }
}

impl Default for InMemoryIdempotencyStore {
    fn default() -> Self {
        Self::build(&MemoryStoreConfig::default())
    }
}

impl InMemoryIdempotencyStore {
    /// A store with the default bounds (100,000 records, 64 MiB).
    pub fn new() -> Self {
        Self::default()
    }

    /// A store with `config`'s bounds; invalid bounds are an error.
    pub fn with_config(config: &MemoryStoreConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::build(config))
    }

    fn build(config: &MemoryStoreConfig) -> Self {
        let min_weight = config.min_weight();
        let cache = Cache::builder()
            .max_capacity(config.max_bytes.max(1))
            .weigher(|_k: &String, v: &Slot| v.weight)
            .expire_after(SlotExpiry)
            .eviction_policy(EvictionPolicy::lru())
            .build_with_hasher(FastState::default());
        InMemoryIdempotencyStore { cache, min_weight }
    }

    /// The number of records held (approximate until [`run_pending_tasks`](Self::run_pending_tasks)).
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

    fn slot(&self, key: &str, record: IdempotencyRecord, ttl: Duration) -> Slot {
        let bytes = key.len().saturating_add(serialized_len(&record));
        let weight = (bytes as u64).max(self.min_weight).min(u64::from(u32::MAX));
        Slot {
            record: Arc::new(record),
            deadline: toolshield_core::config::deadline_after(Instant::now(), ttl),
            ttl,
            weight: u32::try_from(weight).unwrap_or(u32::MAX),
        }
    }

    fn claim_now(&self, key: &str, record: IdempotencyRecord, lease: Duration) -> ClaimOutcome {
        let now = Instant::now();
        let slot = self.slot(key, record, lease);
        let mut out = ClaimOutcome::Claimed;
        self.cache
            .entry(key.to_owned())
            .and_compute_with(|cur| match cur {
                Some(e) if e.value().live(now) => {
                    out = ClaimOutcome::Existing((*e.value().record).clone());
                    Op::Nop
                }
                Some(e) if e.value().record.status == crate::store::RecordStatus::Pending => {
                    // An expired claim that was never finished nor released.
                    out = ClaimOutcome::TakenOver;
                    Op::Put(slot)
                }
                _ => Op::Put(slot),
            });
        out
    }

    /// Owner-checked replace (`record = Some`) or delete (`None`).
    fn fenced(
        &self,
        key: &str,
        owner: &str,
        record: Option<(IdempotencyRecord, Duration)>,
    ) -> bool {
        let now = Instant::now();
        let new = record.map(|(r, ttl)| self.slot(key, r, ttl));
        let mut done = false;
        self.cache
            .entry(key.to_owned())
            .and_compute_with(|cur| match cur {
                Some(e) if e.value().live(now) && e.value().record.is_owned_by(owner) => {
                    done = true;
                    match new {
                        Some(slot) => Op::Put(slot),
                        None => Op::Remove,
                    }
                }
                _ => Op::Nop,
            });
        done
    }

    fn renew_now(&self, key: &str, owner: &str, lease: Duration) -> bool {
        let now = Instant::now();
        let mut done = false;
        self.cache
            .entry(key.to_owned())
            .and_compute_with(|cur| match cur {
                Some(e) if e.value().live(now) && e.value().record.is_owned_by(owner) => {
                    done = true;
                    let record = (*e.value().record).clone().with_lease(lease);
                    Op::Put(self.slot(key, record, lease))
                }
                _ => Op::Nop,
            });
        done
    }

    fn get_now(&self, key: &str) -> Option<IdempotencyRecord> {
        let now = Instant::now();
        self.cache
            .get(key)
            .filter(|s| s.live(now))
            .map(|s| (*s.record).clone())
    }

    fn remove_now(&self, key: &str) -> bool {
        let now = Instant::now();
        self.cache.remove(key).is_some_and(|s| s.live(now))
    }
}

impl IdempotencyStore for InMemoryIdempotencyStore {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        record: IdempotencyRecord,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(ready(Ok(self.claim_now(key, record, lease))))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(ready(Ok(self.fenced(key, owner, Some((record, ttl))))))
    }

    fn fail<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(ready(Ok(self.fenced(key, owner, Some((record, ttl))))))
    }

    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        Box::pin(ready(Ok(self.renew_now(key, owner, lease))))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(ready(Ok(self.fenced(key, owner, None))))
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<IdempotencyRecord>> {
        Box::pin(ready(Ok(self.get_now(key))))
    }

    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(ready(Ok(self.remove_now(key))))
    }
}
