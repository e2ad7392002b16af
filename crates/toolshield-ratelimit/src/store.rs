//! [`RateLimitStore`] and the in-memory [`MemoryRateLimitStore`].

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use toolshield_contract::time;
use toolshield_store::{MemoryBounds, StoreError, StoreFuture, TtlMap, Write};

use crate::gcra::{Decision, RateLimit, Turn};

/// Where the GCRA state of each key lives: in memory ([`MemoryRateLimitStore`]), or
/// shared by every replica (`toolshield_redis::RedisRateLimitStore`).
///
/// A key is `Some(key)`, or `None` for the calls that carry no key (no caller id, no
/// run id): they share one bucket of their own, which no present key can reach.
pub trait RateLimitStore: Send + Sync + 'static {
    /// Decides one call of `key` under `limit`, reserving its place when it may start
    /// within `max_wait` (zero: only at once). Atomic per key.
    fn acquire<'a>(
        &'a self,
        key: Option<&'a str>,
        limit: &'a RateLimit,
        max_wait: Duration,
    ) -> StoreFuture<'a, Decision>;

    /// The same decision without I/O, when the store can give one (an in-memory store):
    /// the layer then decides in `call` and allocates nothing. `None` (the default):
    /// the layer awaits [`acquire`](Self::acquire).
    fn acquire_now(
        &self,
        key: Option<&str>,
        limit: &RateLimit,
        max_wait: Duration,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (key, limit, max_wait);
        None
    }

    /// Gives back the `turn` an admitted call reserved and did not use (it was cancelled
    /// while it waited), if it is still the last turn reserved for `key`; a turn with
    /// later ones behind it stays taken (see [`Turn`]). Best effort; a remote store
    /// sends it in the background.
    fn refund(&self, key: Option<&str>, limit: &RateLimit, turn: Turn);
}

/// Bytes an entry weighs besides its key.
const ENTRY_OVERHEAD: u64 = 64;

/// The longest key stored in a bucket of its own, in bytes; longer keys share the overflow
/// bucket.
const MAX_KEY_LEN: u64 = 4096;

/// The GCRA state of every key in memory, for one process: a bounded [`TtlMap`] of each
/// key's time, each entry living until its time has passed (then the key is as new).
///
/// Bounded: at most `max_keys` keys (CLOCK eviction makes room: a key called again while
/// its time is live gets a second chance, so one-off keys go first; an evicted key
/// starts afresh, so size the bound above the keys active within one period). A key too long
/// to store (longer than 4 KiB) shares one overflow bucket with every such key:
/// limited together, never unlimited.
pub struct MemoryRateLimitStore {
    map: TtlMap<Instant>,
    /// The heaviest entry stored: a key of [`MAX_KEY_LEN`], or less when a shard is smaller.
    max_weight: u64,
    absent: Mutex<Option<Instant>>,
    overflow: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for MemoryRateLimitStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRateLimitStore")
            .field("keys", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryRateLimitStore {
    /// 10,000 keys.
    fn default() -> Self {
        Self::new(10_000)
    }
}

impl MemoryRateLimitStore {
    /// A store of at most `max_keys` keys (at least 1).
    #[must_use]
    pub fn new(max_keys: u64) -> Self {
        let max_keys = max_keys.max(1);
        let bytes = max_keys.saturating_mul(MAX_KEY_LEN + ENTRY_OVERHEAD);
        let map = TtlMap::new(MemoryBounds::new(max_keys, bytes));
        MemoryRateLimitStore {
            max_weight: map.max_weight().min(MAX_KEY_LEN + ENTRY_OVERHEAD),
            map,
            absent: Mutex::new(None),
            overflow: Mutex::new(None),
        }
    }

    /// The number of keys held now (expired ones not yet freed included).
    pub fn len(&self) -> u64 {
        self.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn decide_in(slot: &Mutex<Option<Instant>>, limit: &RateLimit, max_wait: Duration) -> Decision {
        let now = time::now();
        let mut tat = slot.lock().unwrap_or_else(|e| e.into_inner());
        let (decision, next) = limit.decide(*tat, now, max_wait);
        if next.is_some() {
            *tat = next;
        }
        decision
    }

    fn decide(&self, key: Option<&str>, limit: &RateLimit, max_wait: Duration) -> Decision {
        let Some(key) = key else {
            return Self::decide_in(&self.absent, limit, max_wait);
        };
        let weight = key.len() as u64 + ENTRY_OVERHEAD;
        if weight > self.max_weight {
            return Self::decide_in(&self.overflow, limit, max_wait);
        }
        let now = time::now();
        self.map.update_at(key, now, |found| {
            let tat = found.filter(|f| f.live).map(|f| *f.value);
            match limit.decide(tat, now, max_wait) {
                (decision, Some(next)) => (
                    Write::Put {
                        value: next,
                        weight,
                        ttl: next - now,
                        linger: Duration::ZERO,
                    },
                    decision,
                ),
                (decision, None) => (Write::Keep, decision),
            }
        })
    }

    fn refund_in(slot: &Mutex<Option<Instant>>, limit: &RateLimit, turn: Turn) {
        let mut tat = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = *tat {
            if Turn::At(t) == turn {
                *tat = t.checked_sub(limit.interval());
            }
        }
    }
}

impl RateLimitStore for MemoryRateLimitStore {
    fn acquire<'a>(
        &'a self,
        key: Option<&'a str>,
        limit: &'a RateLimit,
        max_wait: Duration,
    ) -> StoreFuture<'a, Decision> {
        let d = self.decide(key, limit, max_wait);
        Box::pin(std::future::ready(Ok(d)))
    }

    #[inline]
    fn acquire_now(
        &self,
        key: Option<&str>,
        limit: &RateLimit,
        max_wait: Duration,
    ) -> Option<Result<Decision, StoreError>> {
        Some(Ok(self.decide(key, limit, max_wait)))
    }

    fn refund(&self, key: Option<&str>, limit: &RateLimit, turn: Turn) {
        let Some(key) = key else {
            return Self::refund_in(&self.absent, limit, turn);
        };
        let weight = key.len() as u64 + ENTRY_OVERHEAD;
        if weight > self.max_weight {
            return Self::refund_in(&self.overflow, limit, turn);
        }
        let now = time::now();
        self.map.update_at(key, now, |found| {
            let Some(tat) = found
                .filter(|f| f.live)
                .map(|f| *f.value)
                .filter(|t| Turn::At(*t) == turn)
            else {
                return (Write::Keep, ());
            };
            match tat.checked_sub(limit.interval()).filter(|t| *t > now) {
                Some(t) => (
                    Write::Put {
                        value: t,
                        weight,
                        ttl: t - now,
                        linger: Duration::ZERO,
                    },
                    (),
                ),
                None => (Write::Remove, ()),
            }
        });
    }
}
