//! [`TtlMap`]: a bounded, sharded map with a TTL per entry and CLOCK eviction.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;
use toolshield_contract::config::{deadline_after, ConfigError};
use toolshield_contract::hash::FastState;
use toolshield_contract::time;

use crate::bounds::MemoryBounds;

/// At most this many shards; fewer when `max_entries` is smaller, so that every shard
/// holds at least one entry.
const MAX_SHARDS: usize = 16;

/// An entry as [`TtlMap::update`] shows it.
#[derive(Debug)]
pub struct Found<'a, V> {
    /// The value.
    pub value: &'a V,
    /// Whether it is live (within its TTL). An entry past its TTL is shown, as not live,
    /// for as long as it was written to linger ([`Write::Put`]).
    pub live: bool,
}

/// What [`TtlMap::update`] does with the entry of its key.
#[derive(Debug)]
pub enum Write<V> {
    /// Leave it as it is (or absent).
    Keep,
    /// Delete it.
    Remove,
    /// Keep its value and give it a new weight and TTL (as a [`Put`](Self::Put) of the
    /// same value would): for a value changed in place through interior mutability. Does
    /// nothing when the key has no entry; an entry that no longer fits is removed.
    Touch {
        /// Its weight in bytes now.
        weight: u64,
        /// How long it is live from now.
        ttl: Duration,
        /// How long after its TTL it lingers (see [`Put`](Self::Put)).
        linger: Duration,
    },
    /// Replace it (or create it).
    Put {
        /// The new value.
        value: V,
        /// Its weight in bytes (its key included), counted against `max_bytes`.
        weight: u64,
        /// How long it is live.
        ttl: Duration,
        /// How long after its TTL it stays visible to [`TtlMap::update`] as not live
        /// (reads never see it): an idempotency claim whose lease expired is told apart
        /// from a free key for one more lease. `Duration::ZERO` for none.
        linger: Duration,
    },
    /// A [`Put`](Self::Put) that eviction never takes while it is live (an idempotency
    /// claim whose call is running: evicting it would free its key for a duplicate). When
    /// the shard holds only such entries and no room can be made, nothing is written and
    /// the key's old entry stays ([`TtlMap::try_update`] reports it).
    Hold {
        /// The new value.
        value: V,
        /// Its weight in bytes (its key included), counted against `max_bytes`.
        weight: u64,
        /// How long it is live (and held).
        ttl: Duration,
        /// How long after its TTL it lingers (see [`Put`](Self::Put)); it is not held then.
        linger: Duration,
    },
}

struct Entry<V> {
    key: Arc<str>,
    /// The key's hash: the index finds the entry's slot by it, so evicting an entry does
    /// not read (or hash) its key again.
    hash: u64,
    value: V,
    /// Live until then; checked against tokio's clock, so paused-clock tests see entries
    /// expire.
    deadline: Instant,
    /// Visible to `update` until then; freed by whoever meets it after.
    keep_until: Instant,
    weight: u64,
    /// Never evicted to make room while live ([`Write::Hold`]).
    held: bool,
    /// Set by every read and every update of a live entry, cleared by the clock hand: an
    /// entry in use gets a second chance.
    referenced: AtomicBool,
}

/// What a write takes out of a shard under its lock (evicted or replaced entries and
/// values), dropped by the caller after the lock is released: freeing a value, its key
/// and what they own is not done while other callers wait for the shard. One entry or
/// value, the common case, is kept without an allocation.
struct Evicted<V> {
    entry: Option<Entry<V>>,
    value: Option<V>,
    more: Vec<Entry<V>>,
}

impl<V> Evicted<V> {
    fn new() -> Self {
        Evicted {
            entry: None,
            value: None,
            more: Vec::new(),
        }
    }

    fn push(&mut self, entry: Option<Entry<V>>) {
        let Some(entry) = entry else { return };
        match self.entry {
            None => self.entry = Some(entry),
            Some(_) => self.more.push(entry),
        }
    }

    /// A replaced value (only one per write).
    fn push_value(&mut self, value: V) {
        self.value = Some(value);
    }
}

/// A shard under its lock, on lines of its own: two workers writing neighbouring shards
/// do not take each other's lines.
#[repr(align(128))]
struct Lane<V>(RwLock<Shard<V>>);

/// A part of the map with its own lock and its own share of both bounds.
struct Shard<V> {
    /// The slot of every entry, by the key's hash (computed once per operation, by the
    /// map; the shard is chosen by other bits of the same hash).
    index: HashTable<usize>,
    /// The clock: entries in insertion slots, `None` for a free slot.
    slots: Vec<Option<Entry<V>>>,
    free: Vec<usize>,
    hand: usize,
    bytes: u64,
    max_entries: usize,
    max_bytes: u64,
}

impl<V> Shard<V> {
    fn new(max_entries: usize, max_bytes: u64) -> Self {
        Shard {
            index: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            bytes: 0,
            max_entries,
            max_bytes,
        }
    }

    /// The slot of `key`, whose hash is `hash`.
    fn find(&self, hash: u64, key: &str) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash, |&pos| {
                slots
                    .get(pos)
                    .and_then(Option::as_ref)
                    .is_some_and(|e| *e.key == *key)
            })
            .copied()
    }

    fn entry(&self, hash: u64, key: &str) -> Option<&Entry<V>> {
        let pos = self.find(hash, key)?;
        self.slots.get(pos)?.as_ref()
    }

    fn remove_at(&mut self, pos: usize) -> Option<Entry<V>> {
        let entry = self.slots.get_mut(pos)?.take()?;
        // Found by its hash and its slot: the key is not compared.
        if let Ok(found) = self.index.find_entry(entry.hash, |&p| p == pos) {
            found.remove();
        }
        self.bytes -= entry.weight;
        self.free.push(pos);
        Some(entry)
    }

    fn remove(&mut self, hash: u64, key: &str) -> Option<Entry<V>> {
        let pos = self.find(hash, key)?;
        self.remove_at(pos)
    }

    /// Evicts until one more entry of `weight` bytes fits: expired entries first as the
    /// hand meets them, then entries not read since the hand last passed (CLOCK). The
    /// evicted entries go to `evicted`, to be freed once the shard's lock is released.
    /// Live held entries ([`Write::Hold`]) are never evicted: `false` when two turns of the
    /// hand (one clears the marks, the next evicts) found nothing else to take.
    fn make_room(&mut self, weight: u64, now: Instant, evicted: &mut Evicted<V>) -> bool {
        let mut idle = 0usize;
        while !self.index.is_empty()
            && (self.index.len() >= self.max_entries || self.bytes + weight > self.max_bytes)
        {
            if idle > 2 * self.slots.len() {
                return false;
            }
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let pos = self.hand;
            self.hand += 1;
            // The write lock is held: the read mark is cleared with a plain write, not an
            // atomic swap.
            let evict = match &mut self.slots[pos] {
                None => false,
                Some(e) if now >= e.deadline => true,
                Some(e) if e.held => false,
                Some(e) => !std::mem::take(e.referenced.get_mut()),
            };
            if evict {
                idle = 0;
                evicted.push(self.remove_at(pos));
            } else {
                idle += 1;
            }
        }
        true
    }

    /// Replaces the entry of `key` (if any) with a new one, evicting what it needs to fit.
    /// A value heavier than the shard's share of `max_bytes` is not stored.
    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        key: &str,
        hash: u64,
        at: Option<usize>,
        value: V,
        weight: u64,
        (ttl, linger, held): (Duration, Duration, bool),
        now: Instant,
        evicted: &mut Evicted<V>,
    ) -> bool {
        // An entry already there (`at`, its slot, when the caller looked it up) whose
        // replacement fits the bytes it frees (the count is unchanged) is overwritten in
        // its slot: no eviction can be needed, and the key keeps its index entry and its
        // allocation.
        if let Some(pos) = at {
            if let Some(Some(entry)) = self.slots.get_mut(pos) {
                let bytes = self.bytes - entry.weight + weight;
                if weight <= self.max_bytes && bytes <= self.max_bytes {
                    let deadline = deadline_after(now, ttl);
                    evicted.push_value(std::mem::replace(&mut entry.value, value));
                    entry.deadline = deadline;
                    entry.keep_until = deadline_after(deadline, linger);
                    entry.weight = weight;
                    entry.held = held;
                    self.bytes = bytes;
                    return true;
                }
            }
        }
        // The old entry goes first, whatever happens to the new one: never serve a value
        // older than the one just written.
        let old = match at {
            Some(pos) => self.remove_at(pos),
            None => None,
        };
        if weight > self.max_bytes {
            evicted.push(old);
            evicted.push_value(value);
            return false;
        }
        if !self.make_room(weight, now, evicted) {
            // Only held entries left: nothing is written, and the old entry (which fitted
            // before) goes back, so a write that cannot be stored loses nothing.
            evicted.push_value(value);
            if let Some(old) = old {
                if self.bytes + old.weight <= self.max_bytes {
                    self.insert_entry(old);
                } else {
                    evicted.push(Some(old));
                }
            }
            return false;
        }
        // A replaced entry's read mark goes to its successor.
        let (key, referenced) = match old {
            Some(mut old) => {
                let referenced = *old.referenced.get_mut();
                evicted.push_value(old.value);
                (old.key, referenced)
            }
            None => (Arc::from(key), false),
        };
        let deadline = deadline_after(now, ttl);
        let entry = Entry {
            key,
            hash,
            value,
            deadline,
            keep_until: deadline_after(deadline, linger),
            weight,
            held,
            referenced: AtomicBool::new(referenced),
        };
        self.insert_entry(entry);
        true
    }

    /// Puts `entry` in a free slot and indexes it (room was made for it).
    fn insert_entry(&mut self, entry: Entry<V>) {
        let hash = entry.hash;
        self.bytes += entry.weight;
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
        let slots = &self.slots;
        self.index.insert_unique(hash, pos, |&p| {
            slots.get(p).and_then(Option::as_ref).map_or(0, |e| e.hash)
        });
    }

    /// Gives the entry in slot `pos` a new weight and TTL, in place when it still fits the
    /// shard's bytes; an entry that no longer fits is removed (as `put` would leave it),
    /// into `evicted`.
    fn touch(
        &mut self,
        pos: usize,
        (weight, ttl, linger): (u64, Duration, Duration),
        now: Instant,
        evicted: &mut Evicted<V>,
    ) {
        let Some(Some(entry)) = self.slots.get_mut(pos) else {
            return;
        };
        let bytes = self.bytes - entry.weight + weight;
        if weight > self.max_bytes || bytes > self.max_bytes {
            evicted.push(self.remove_at(pos));
            return;
        }
        let deadline = deadline_after(now, ttl);
        entry.deadline = deadline;
        entry.keep_until = deadline_after(deadline, linger);
        entry.weight = weight;
        self.bytes = bytes;
    }

    fn purge_expired(&mut self, now: Instant) {
        for pos in 0..self.slots.len() {
            if self.slots[pos]
                .as_ref()
                .is_some_and(|e| now >= e.keep_until)
            {
                self.remove_at(pos);
            }
        }
    }
}

/// A bounded map from string keys to values, with a TTL per entry, in the memory of one
/// process: the in-memory cache and idempotency stores are built on it.
///
/// Bounded by entries and by bytes (each entry weighs what its writer says). Both bounds
/// hold after every write: a write first evicts what it needs to fit, with no background
/// maintenance. The keys are spread over up to 16 shards (a power of two no larger than
/// `max_entries`), each under its own `RwLock` with an equal share of both bounds, so a
/// skewed key set may evict a little before the totals are reached, and a value heavier
/// than a shard's share of `max_bytes` is not stored.
///
/// Eviction is CLOCK (second chance): every read marks its entry, the clock hand clears
/// marks and evicts the first entry it finds unmarked, or expired. An entry read at least
/// once per turn of the hand survives any flood of one-off keys. TTLs are checked on every
/// access against tokio's clock. Reads take a shared lock; [`update`](Self::update) is
/// atomic per key. Clones share the entries.
///
/// ```
/// use std::time::Duration;
/// use toolshield_store::{MemoryBounds, TtlMap, Write};
///
/// let map: TtlMap<String> = TtlMap::new(MemoryBounds::new(100, 10_000));
/// assert!(map.insert("k", "v".to_owned(), 2, Duration::from_secs(60)));
/// assert_eq!(map.get("k", |v, _left| v.clone()).as_deref(), Some("v"));
/// // Create-if-absent, atomically: the entry is there, so nothing is written.
/// let created = map.update("k", |found| match found {
///     Some(f) if f.live => (Write::Keep, false),
///     _ => (Write::Put { value: "w".to_owned(), weight: 2, ttl: Duration::from_secs(60), linger: Duration::ZERO }, true),
/// });
/// assert!(!created);
/// assert!(map.remove("k"));
/// assert_eq!(map.len(), 0);
/// ```
pub struct TtlMap<V> {
    shards: Arc<[Lane<V>]>,
    hasher: FastState,
    max_weight: u64,
}

impl<V> Clone for TtlMap<V> {
    fn clone(&self) -> Self {
        TtlMap {
            shards: Arc::clone(&self.shards),
            hasher: self.hasher.clone(),
            max_weight: self.max_weight,
        }
    }
}

impl<V> std::fmt::Debug for TtlMap<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtlMap")
            .field("shards", &self.shards.len())
            .field("entries", &self.len())
            .field("weighted_size", &self.weighted_size())
            .finish()
    }
}

impl<V> TtlMap<V> {
    /// A map with `bounds` (a bound of 0 counts as 1; see [`with_bounds`](Self::with_bounds)
    /// to reject invalid bounds).
    pub fn new(bounds: MemoryBounds) -> Self {
        let max_entries = usize::try_from(bounds.max_entries.max(1)).unwrap_or(usize::MAX);
        // A power of two no larger than the entry bound: each shard holds at least one.
        let shards = if max_entries >= MAX_SHARDS {
            MAX_SHARDS
        } else {
            1 << max_entries.ilog2()
        };
        let per_shard_entries = max_entries / shards;
        let per_shard_bytes = (bounds.max_bytes.max(1) / shards as u64).max(1);
        TtlMap {
            shards: (0..shards)
                .map(|_| Lane(RwLock::new(Shard::new(per_shard_entries, per_shard_bytes))))
                .collect(),
            hasher: FastState::default(),
            max_weight: per_shard_bytes,
        }
    }

    /// A map with `bounds`; invalid bounds are an error.
    pub fn with_bounds(bounds: MemoryBounds) -> Result<Self, ConfigError> {
        bounds.validate()?;
        Ok(Self::new(bounds))
    }

    /// The heaviest entry the map stores: a shard's share of `max_bytes`.
    pub fn max_weight(&self) -> u64 {
        self.max_weight
    }

    /// The hash of `key`, computed once per operation: it picks the shard (by bits the
    /// shard's index does not use for its buckets) and finds the slot.
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard<V>> {
        // `shards.len()` is a power of two, at most 16: bits 32 to 35. The index takes
        // its buckets from the low bits and its tags from the top seven.
        let h = (hash >> 32) as usize;
        &self.shards[h & (self.shards.len() - 1)].0
    }

    fn read(shard: &RwLock<Shard<V>>) -> RwLockReadGuard<'_, Shard<V>> {
        shard.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(shard: &RwLock<Shard<V>>) -> RwLockWriteGuard<'_, Shard<V>> {
        shard.write().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` of the live entry under `key` and the time it has left, under a shared lock;
    /// `None` when there is none. Marks the entry read (CLOCK).
    pub fn get<R>(&self, key: &str, f: impl FnOnce(&V, Duration) -> R) -> Option<R> {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        let (stale, now) = {
            let guard = Self::read(shard);
            let entry = guard.entry(hash, key)?;
            // Read only when there is an entry: a miss reads no clock.
            let now = time::now();
            if now < entry.deadline {
                // Written only when not yet set: a hot entry's line is then only read by
                // the threads that hit it, not written by each of them.
                if !entry.referenced.load(Ordering::Relaxed) {
                    entry.referenced.store(true, Ordering::Relaxed);
                }
                return Some(f(&entry.value, entry.deadline - now));
            }
            (now >= entry.keep_until, now)
        };
        if stale {
            // Expired for good: free it now rather than when the hand comes round.
            let mut evicted = Evicted::new();
            let mut guard = Self::write(shard);
            if guard.entry(hash, key).is_some_and(|e| now >= e.keep_until) {
                evicted.push(guard.remove(hash, key));
            }
        }
        None
    }

    /// Stores `value` of `weight` bytes under `key` for `ttl`, replacing any entry; `false`
    /// when it is heavier than [`max_weight`](Self::max_weight) (the old entry is removed
    /// all the same). A zero `ttl` stores an entry that is never live.
    pub fn insert(&self, key: &str, value: V, weight: u64, ttl: Duration) -> bool {
        let hash = self.hash(key);
        // The clock is read before the lock is taken, and what the write takes out is
        // freed after it is released.
        let now = time::now();
        let mut evicted = Evicted::new();
        let mut guard = Self::write(self.shard(hash));
        let at = guard.find(hash, key);
        let stored = guard.put(
            key,
            hash,
            at,
            value,
            weight,
            (ttl, Duration::ZERO, false),
            now,
            &mut evicted,
        );
        drop(guard);
        drop(evicted);
        stored
    }

    /// Reads and writes the entry of `key` atomically (under the shard's write lock): `f`
    /// sees the entry, live or lingering ([`Found`]), and says what to write and what to
    /// return. A [`Write::Put`] heavier than [`max_weight`](Self::max_weight) removes the
    /// entry and stores nothing (check the weight first).
    pub fn update<R>(&self, key: &str, f: impl FnOnce(Option<Found<'_, V>>) -> (Write<V>, R)) -> R {
        self.update_at(key, time::now(), f)
    }

    /// [`update`](Self::update) at `now`, a time the caller has just read (one clock read
    /// for a caller that needs the time itself).
    pub fn update_at<R>(
        &self,
        key: &str,
        now: Instant,
        f: impl FnOnce(Option<Found<'_, V>>) -> (Write<V>, R),
    ) -> R {
        self.try_update_at(key, now, f).0
    }

    /// [`update`](Self::update), and whether its write was applied: `false` when a
    /// [`Write::Put`] or [`Write::Hold`] stored nothing (too heavy, or no room left beside
    /// live held entries). [`Write::Keep`], [`Write::Remove`] and [`Write::Touch`] count
    /// as applied.
    pub fn try_update<R>(
        &self,
        key: &str,
        f: impl FnOnce(Option<Found<'_, V>>) -> (Write<V>, R),
    ) -> (R, bool) {
        self.try_update_at(key, time::now(), f)
    }

    fn try_update_at<R>(
        &self,
        key: &str,
        now: Instant,
        f: impl FnOnce(Option<Found<'_, V>>) -> (Write<V>, R),
    ) -> (R, bool) {
        let hash = self.hash(key);
        // Declared before the guard: dropped after the lock is released.
        let mut evicted = Evicted::new();
        let mut guard = Self::write(self.shard(hash));
        // One lookup of the key: the slot serves the write too.
        let at = guard.find(hash, key);
        let found = at
            .and_then(|pos| guard.slots.get(pos))
            .and_then(Option::as_ref)
            .and_then(|e| {
                (now < e.keep_until).then(|| Found {
                    value: &e.value,
                    live: now < e.deadline,
                })
            });
        let live = found.as_ref().is_some_and(|f| f.live);
        let (write, out) = f(found);
        if live {
            // A live entry read and written again is in use, as one read by `get` is: it
            // gets CLOCK's second chance, so a flood of one-off keys cannot evict a key
            // in steady use (a rate limiter's or a budget's, which only ever update). The
            // write lock is held: a plain write.
            if let Some(Some(e)) = at.and_then(|pos| guard.slots.get_mut(pos)) {
                *e.referenced.get_mut() = true;
            }
        }
        let applied = match (write, at) {
            (Write::Keep, _) | (Write::Remove | Write::Touch { .. }, None) => true,
            (Write::Remove, Some(pos)) => {
                evicted.push(guard.remove_at(pos));
                true
            }
            (
                Write::Touch {
                    weight,
                    ttl,
                    linger,
                },
                Some(pos),
            ) => {
                guard.touch(pos, (weight, ttl, linger), now, &mut evicted);
                true
            }
            (
                Write::Put {
                    value,
                    weight,
                    ttl,
                    linger,
                },
                at,
            ) => guard.put(
                key,
                hash,
                at,
                value,
                weight,
                (ttl, linger, false),
                now,
                &mut evicted,
            ),
            (
                Write::Hold {
                    value,
                    weight,
                    ttl,
                    linger,
                },
                at,
            ) => guard.put(
                key,
                hash,
                at,
                value,
                weight,
                (ttl, linger, true),
                now,
                &mut evicted,
            ),
        };
        (out, applied)
    }

    /// Deletes the entry under `key`; `true` when a live one was there.
    pub fn remove(&self, key: &str) -> bool {
        let now = time::now();
        let hash = self.hash(key);
        // Taken out under the lock, freed after it.
        let removed = Self::write(self.shard(hash)).remove(hash, key);
        removed.is_some_and(|e| now < e.deadline)
    }

    /// The number of entries, expired ones not yet freed included.
    pub fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| Self::read(&s.0).index.len() as u64)
            .sum()
    }

    /// Whether the map holds no entry at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The weighted size in bytes of the entries [`len`](Self::len) counts.
    pub fn weighted_size(&self) -> u64 {
        self.shards.iter().map(|s| Self::read(&s.0).bytes).sum()
    }

    /// Frees every expired entry now (otherwise they go when read, or when the clock hand
    /// meets them). Entries still lingering ([`Write::Put`]) stay.
    pub fn purge_expired(&self) {
        let now = time::now();
        for shard in self.shards.iter() {
            Self::write(&shard.0).purge_expired(now);
        }
    }
}
