//! [`BreakerRegistry`]: the breakers of every key, shared by every service built from it,
//! bounded by eviction of idle closed breakers, with manual control and events.

use std::fmt;
use std::fs::OpenOptions;
use std::hash::BuildHasher;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, TryLockError};
use std::time::Duration;

use tokio::sync::broadcast;
use toolshield_contract::config::Problems;
use toolshield_contract::hash::{FastHashMap, FastState};
use toolshield_contract::ConfigError;

use crate::config::BreakerConfig;
use crate::event_log::EventLog;
use crate::events::{BreakerEvent, CircuitState, EventHub, EvictedCounts, TransitionCount};
use crate::state::{BreakerState, BreakerStatus, Core, Override};

const SHARDS: usize = 16;

/// The longest key the registry holds a breaker for, in bytes. A call whose key is longer
/// runs under the registry's overflow breaker, as a call to a full registry does (it
/// admits and never trips; counted by [`BreakerRegistry::overflowed`]), so the registry
/// holds at most `max_keys` keys of at most this length whatever a [`KeyFn`](crate::KeyFn)
/// returns.
pub const MAX_KEY_LEN: usize = 4096;

/// The most often a call may run a sweep (less if `idle_ttl` is shorter): a full
/// registry whose breakers cannot be evicted would otherwise sweep on every new key.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

type Shard = RwLock<FastHashMap<Arc<str>, Arc<BreakerState>>>;

struct Inner {
    core: Arc<Core>,
    shards: Box<[Shard]>,
    hasher: FastState,
    len: AtomicUsize,
    /// When the last sweep run by a call started (registry clock).
    last_sweep: AtomicU64,
    /// No call runs a sweep before this time (registry clock).
    sweep_after: AtomicU64,
    /// Sweeps run, by calls or by `evict_idle`.
    sweeps: AtomicU64,
    overflowed: AtomicU64,
    /// The breaker of calls whose key a full registry cannot keep (made once).
    overflow: std::sync::OnceLock<Arc<BreakerState>>,
    sweep_lock: Mutex<()>,
}

/// The breakers of every key.
///
/// A cheap handle (an `Arc`): every clone, every [`BreakerLayer`](crate::BreakerLayer)
/// built from it and every service those layers build see the same breaker for a key.
/// It is also the control handle: status, force open, force closed, metrics-only, reset,
/// per key or for all, and the event subscription.
///
/// The registry is bounded: it holds at most [`max_keys`](BreakerConfig::max_keys)
/// breakers. When a new key arrives and the registry is full, or once per
/// [`idle_ttl`](BreakerConfig::idle_ttl), a sweep evicts closed breakers without a manual
/// override that were not used since the previous sweep; calls run at most one sweep per
/// second (per `idle_ttl` if shorter), so a registry full of breakers that cannot be
/// evicted does not sweep on every new key. If it is still full, the call runs under a
/// fresh breaker that is not kept (counted by [`overflowed`](Self::overflowed)), as does a
/// call whose key is longer than [`MAX_KEY_LEN`]. An
/// evicted breaker takes its counts with it (see [`evicted_counts`](Self::evicted_counts)).
///
/// ```
/// use toolshield_breaker::{BreakerRegistry, CircuitState};
///
/// let registry = BreakerRegistry::default();
/// registry.force_open("payments");
/// assert_eq!(registry.status("payments").unwrap().state, CircuitState::ForcedOpen);
/// registry.reset("payments");
/// assert_eq!(registry.status("payments").unwrap().state, CircuitState::Closed);
/// ```
#[derive(Clone)]
pub struct BreakerRegistry {
    inner: Arc<Inner>,
}

impl Default for BreakerRegistry {
    /// A registry with [`BreakerConfig::default`].
    fn default() -> Self {
        Self::build(BreakerConfig::default(), EventHub::new(None))
    }
}

impl fmt::Debug for BreakerRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerRegistry")
            .field("keys", &self.len())
            .field("config", &self.inner.core.config)
            .finish()
    }
}

impl BreakerRegistry {
    /// A registry whose breakers follow `config`; every problem of the config is
    /// reported, and an `events_file` that cannot be opened is one of them.
    pub fn new(config: BreakerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let log = match &config.events_file {
            None => None,
            Some(path) => match open_log(path) {
                Ok(log) => Some(log),
                Err(e) => {
                    let mut p = Problems::new();
                    p.push(
                        "events_file",
                        format_args!("cannot open {}: {e}", path.display()),
                    );
                    p.into_result()?;
                    None
                }
            },
        };
        Ok(Self::build(config, EventHub::new(log)))
    }

    fn build(config: BreakerConfig, events: EventHub) -> Self {
        BreakerRegistry {
            inner: Arc::new(Inner {
                core: Arc::new(Core::new(config, events)),
                shards: (0..SHARDS)
                    .map(|_| RwLock::new(FastHashMap::default()))
                    .collect(),
                hasher: FastState::default(),
                len: AtomicUsize::new(0),
                last_sweep: AtomicU64::new(0),
                sweep_after: AtomicU64::new(0),
                sweeps: AtomicU64::new(0),
                overflowed: AtomicU64::new(0),
                overflow: std::sync::OnceLock::new(),
                sweep_lock: Mutex::new(()),
            }),
        }
    }

    /// The configuration every breaker follows.
    pub fn config(&self) -> &BreakerConfig {
        &self.inner.core.config
    }

    fn shard(&self, key: &str) -> &Shard {
        let h = self.inner.hasher.hash_one(key) as usize;
        &self.inner.shards[h % SHARDS]
    }

    fn read(
        shard: &Shard,
    ) -> std::sync::RwLockReadGuard<'_, FastHashMap<Arc<str>, Arc<BreakerState>>> {
        shard.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(
        shard: &Shard,
    ) -> std::sync::RwLockWriteGuard<'_, FastHashMap<Arc<str>, Arc<BreakerState>>> {
        shard.write().unwrap_or_else(|e| e.into_inner())
    }

    fn find(&self, key: &str) -> Option<Arc<BreakerState>> {
        Self::read(self.shard(key)).get(key).cloned()
    }

    /// The breaker of `key`, created if needed (the service's lookup on a cache miss).
    pub(crate) fn get_or_insert(&self, key: &str) -> Arc<BreakerState> {
        self.held_or_inserted(key).unwrap_or_else(|| self.unkept())
    }

    /// Gives `key` a breaker of its own, closed and without override, unless the registry
    /// holds one already, within [`max_keys`](BreakerConfig::max_keys): a full registry
    /// first evicts idle breakers, as a call's lookup does. Returns whether the registry
    /// holds a breaker for `key` afterwards: `false` when it is full of breakers that
    /// cannot be evicted (in use, open, or under an override), or when `key` is longer than
    /// [`MAX_KEY_LEN`] (no call runs under such a key).
    ///
    /// The manual overrides ([`force_open`](Self::force_open) and the others) create the
    /// key's breaker whatever the bound, since an operator's action must not be refused;
    /// an API that creates keys for remote callers (the admin API's `?create=true`)
    /// inserts them here first, so that the keys it creates stay within the bound.
    pub fn insert(&self, key: &str) -> bool {
        if self.held_or_inserted(key).is_some() {
            return true;
        }
        // A call's lookup sweeps a full registry at most once a sweep interval; a key
        // asked for by name is worth a sweep of its own (two passes: the second takes what
        // the first found used, if it was not used again in between).
        key.len() <= MAX_KEY_LEN && self.sweep(2) > 0 && self.held_or_inserted(key).is_some()
    }

    /// The breaker the registry holds for `key`, created if the bound leaves room; `None`
    /// when the key cannot be kept.
    fn held_or_inserted(&self, key: &str) -> Option<Arc<BreakerState>> {
        if key.len() > MAX_KEY_LEN {
            // Never held for a call: the registry's memory is bounded by `max_keys` keys
            // of at most this length, whatever a key function returns. Only an operator's
            // override (`force_open` and the like) puts such a key in the map, and then
            // its calls run under it.
            let s = self.find(key)?;
            s.touch();
            return Some(s);
        }
        if let Some(s) = Self::read(self.shard(key)).get(key) {
            s.touch();
            return Some(Arc::clone(s));
        }
        let inner = &self.inner;
        let config = &inner.core.config;
        let now = inner.core.now_nanos();
        let full = inner.len.load(Ordering::Acquire) >= config.max_keys;
        let ttl = nanos(config.idle_ttl);
        let due = now.saturating_sub(inner.last_sweep.load(Ordering::Relaxed)) >= ttl;
        if (full || due) && self.claim_sweep(now, ttl) {
            inner.last_sweep.store(now, Ordering::Relaxed);
            self.sweep(if full { 2 } else { 1 });
        }
        if inner.len.load(Ordering::Acquire) >= config.max_keys {
            // Still full: no write lock for a key that cannot be kept, unless another call
            // inserted it meanwhile.
            let held = Self::read(self.shard(key)).get(key).cloned()?;
            held.touch();
            return Some(held);
        }
        let mut map = Self::write(self.shard(key));
        if let Some(s) = map.get(key) {
            s.touch();
            return Some(Arc::clone(s));
        }
        if inner.len.load(Ordering::Acquire) >= config.max_keys {
            return None;
        }
        let state = Arc::new(BreakerState::new(
            Arc::from(key),
            Arc::clone(&inner.core),
            true,
        ));
        map.insert(Arc::clone(&state.key), Arc::clone(&state));
        inner.len.fetch_add(1, Ordering::AcqRel);
        Some(state)
    }

    /// Takes the right to sweep now, for one call in a sweep interval.
    fn claim_sweep(&self, now: u64, ttl: u64) -> bool {
        let after = self.inner.sweep_after.load(Ordering::Acquire);
        now >= after
            && self
                .inner
                .sweep_after
                .compare_exchange(
                    after,
                    now.saturating_add(ttl.min(nanos(SWEEP_INTERVAL))),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// The breaker for one call of a full registry whose key cannot be kept: one shared,
    /// disabled breaker (it admits and never trips, as a fresh breaker for a single call
    /// would), marked evicted so no service caches it. No allocation per call.
    fn unkept(&self) -> Arc<BreakerState> {
        self.inner.overflowed.fetch_add(1, Ordering::Relaxed);
        let core = &self.inner.core;
        Arc::clone(
            self.inner
                .overflow
                .get_or_init(|| Arc::new(BreakerState::overflow(Arc::clone(core)))),
        )
    }

    /// The breaker of `key`, created if needed whatever the bound, and pinned: a layer
    /// built for this one key holds it, and the sweep never evicts it.
    pub(crate) fn pinned(&self, key: &str) -> Arc<BreakerState> {
        self.change_held(key, |state| state.pinned.store(true, Ordering::Release))
    }

    /// Makes `change` (a pin or a manual override) on the breaker of `key`, created if
    /// needed, so that it is made on the breaker the registry holds afterwards.
    ///
    /// The sweep may pick the breaker as evictable (closed, without override, not pinned)
    /// between its lookup here and the change, and evict it after: the override would
    /// then be lost with it, and the key's next call would find a fresh closed breaker.
    /// Marking the breaker used after the change pairs with the sweep's `evicted` /
    /// `touched` handshake: either the sweep sees the use and keeps the breaker (which the
    /// change has made unevictable), or this sees the eviction and changes the key's new
    /// breaker.
    fn change_held(&self, key: &str, change: impl Fn(&BreakerState)) -> Arc<BreakerState> {
        loop {
            let state = self.get_for_override(key);
            change(&state);
            if self.still_held(&state) {
                return state;
            }
        }
    }

    /// Whether the registry still holds `state` after a change made to it (see
    /// [`change_held`](Self::change_held)).
    fn still_held(&self, state: &Arc<BreakerState>) -> bool {
        // `touch` sees an eviction the sweep may yet take back (it un-evicts a breaker
        // used meanwhile): the map, read once the sweep's write lock is released, decides.
        state.touch()
            || self
                .find(&state.key)
                .is_some_and(|held| Arc::ptr_eq(&held, state))
    }

    /// Applies `override_` to the breaker of `key`, held by the registry afterwards.
    fn set_mode_held(&self, key: &str, override_: Override) {
        self.change_held(key, |state| state.set_mode(override_));
    }

    /// Applies `override_` to every breaker held; one evicted meanwhile is replaced by
    /// the key's new breaker, which gets the override.
    fn set_mode_all(&self, override_: Override) {
        for state in self.all() {
            state.set_mode(override_);
            // A key evicted meanwhile was closed without override: as good as reset.
            if override_ != Override::Reset && !self.still_held(&state) {
                self.set_mode_held(&state.key, override_);
            }
        }
    }

    /// The breaker of `key` for a manual action: created if needed, whatever the bound.
    fn get_for_override(&self, key: &str) -> Arc<BreakerState> {
        if let Some(s) = self.find(key) {
            return s;
        }
        let mut map = Self::write(self.shard(key));
        if let Some(s) = map.get(key) {
            return Arc::clone(s);
        }
        let state = Arc::new(BreakerState::new(
            Arc::from(key),
            Arc::clone(&self.inner.core),
            true,
        ));
        map.insert(Arc::clone(&state.key), Arc::clone(&state));
        self.inner.len.fetch_add(1, Ordering::AcqRel);
        state
    }

    /// One sweep of up to `passes` passes (a second pass evicts what the first found
    /// used, if it was not used again in between: the CLOCK second-chance rule).
    fn sweep(&self, passes: usize) -> usize {
        let inner = &self.inner;
        let _guard = match inner.sweep_lock.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return 0,
        };
        inner.sweeps.fetch_add(1, Ordering::Relaxed);
        let mut gone = Vec::new();
        for _ in 0..passes {
            let before = gone.len();
            let full = inner.len.load(Ordering::Acquire) >= inner.core.config.max_keys;
            for shard in inner.shards.iter() {
                Self::write(shard).retain(|_, s| {
                    if !s.evictable(full) || s.touched.swap(false, Ordering::SeqCst) {
                        return true;
                    }
                    s.evicted.store(true, Ordering::SeqCst);
                    if s.touched.load(Ordering::SeqCst) {
                        s.evicted.store(false, Ordering::SeqCst);
                        return true;
                    }
                    gone.push(Arc::clone(s));
                    false
                });
            }
            inner.len.fetch_sub(gone.len() - before, Ordering::AcqRel);
            if inner.len.load(Ordering::Acquire) < inner.core.config.max_keys {
                break;
            }
        }
        // After the removal, so a reader that sees these totals no longer sees the keys;
        // and outside the shard locks, which a transition callback (run under a breaker's
        // lock) may want.
        for s in &gone {
            s.retire();
        }
        gone.len()
    }

    /// Runs an eviction pass now: closed breakers without an override that were not used
    /// since the previous pass are dropped. Returns how many were evicted.
    pub fn evict_idle(&self) -> usize {
        self.sweep(1)
    }

    /// How many breakers the registry holds.
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Acquire)
    }

    /// Whether the registry holds no breaker.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls that ran under a breaker that was not kept: the registry was full, or the
    /// key was longer than [`MAX_KEY_LEN`].
    pub fn overflowed(&self) -> u64 {
        self.inner.overflowed.load(Ordering::Relaxed)
    }

    fn all(&self) -> Vec<Arc<BreakerState>> {
        let mut out = Vec::with_capacity(self.len());
        for shard in self.inner.shards.iter() {
            out.extend(Self::read(shard).values().cloned());
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// The status of the breaker of `key`, if the registry holds one. Reading a status
    /// changes nothing (an open breaker whose wait is over moves to half-open on its
    /// next call).
    pub fn status(&self, key: &str) -> Option<BreakerStatus> {
        self.find(key).map(|s| s.status())
    }

    /// The status of every breaker, sorted by key.
    pub fn status_all(&self) -> Vec<BreakerStatus> {
        self.all().iter().map(|s| s.status()).collect()
    }

    /// How many breakers the registry holds in each state, in the order of
    /// [`CircuitState::ALL`]: one pass under each shard's read lock, with nothing copied,
    /// sorted or allocated (what an unauthenticated `/healthz` reports on every request,
    /// where [`status_all`](Self::status_all) would copy every key).
    pub fn state_counts(&self) -> [(CircuitState, usize); CircuitState::ALL.len()] {
        let mut counts = CircuitState::ALL.map(|state| (state, 0usize));
        for shard in self.inner.shards.iter() {
            for breaker in Self::read(shard).values() {
                let state = breaker.state();
                if let Some((_, n)) = counts.iter_mut().find(|(s, _)| *s == state) {
                    *n += 1;
                }
            }
        }
        counts
    }

    /// The effective state of `key` (`Closed` for a key the registry does not hold).
    pub fn state(&self, key: &str) -> CircuitState {
        self.find(key).map_or(CircuitState::Closed, |s| s.state())
    }

    /// Forces `key` open: every call is rejected with `CIRCUIT_OPEN` until
    /// [`reset`](Self::reset) or another override.
    pub fn force_open(&self, key: &str) {
        self.set_mode_held(key, Override::ForceOpen);
    }

    /// Forces `key` closed (disabled): every call passes and is recorded; it never trips.
    pub fn force_closed(&self, key: &str) {
        self.set_mode_held(key, Override::ForceClosed);
    }

    /// Puts `key` in metrics-only (shadow) mode: it records and reports transitions, but
    /// never rejects a call.
    pub fn metrics_only(&self, key: &str) {
        self.set_mode_held(key, Override::MetricsOnly);
    }

    /// Resets `key` to a fresh closed breaker and lifts any override.
    pub fn reset(&self, key: &str) {
        self.set_mode_held(key, Override::Reset);
    }

    /// [`force_open`](Self::force_open) for every breaker held.
    pub fn force_open_all(&self) {
        self.set_mode_all(Override::ForceOpen);
    }

    /// [`force_closed`](Self::force_closed) for every breaker held.
    pub fn force_closed_all(&self) {
        self.set_mode_all(Override::ForceClosed);
    }

    /// [`metrics_only`](Self::metrics_only) for every breaker held.
    pub fn metrics_only_all(&self) {
        self.set_mode_all(Override::MetricsOnly);
    }

    /// [`reset`](Self::reset) for every breaker held.
    pub fn reset_all(&self) {
        self.set_mode_all(Override::Reset);
    }

    /// Makes closed breakers also reject keys that `shared` reports open elsewhere (see
    /// [`SharedOpenState`](crate::SharedOpenState); `toolshield-redis` shares open-state
    /// between processes). Set once: `false` if the registry already had one. Without it
    /// (the default) breakers only see their own process.
    pub fn share_open_state(&self, shared: Arc<dyn crate::shared::SharedOpenState>) -> bool {
        self.inner.core.shared.set(shared).is_ok()
    }

    /// A receiver of every transition and override from now on (a `tokio` broadcast
    /// channel of 1024 events; a slow receiver sees `Lagged`).
    pub fn subscribe(&self) -> broadcast::Receiver<BreakerEvent> {
        self.inner.core.events.subscribe()
    }

    /// Calls `callback` on every transition and override, synchronously, with the
    /// breaker's transition lock held: keep it short.
    ///
    /// The callback may call the registry and its breakers again, the same key included
    /// (reset a breaker that opened, read [`transition_counts`](Self::transition_counts),
    /// call the service): a change it makes to the breaker whose event it is handling
    /// happens at once, and its event is delivered right after the current one has reached
    /// every sink, so every sink sees one key's events in transition order.
    pub fn on_event<F>(&self, callback: F)
    where
        F: Fn(&BreakerEvent) + Send + Sync + 'static,
    {
        self.inner.core.events.add_callback(Arc::new(callback));
    }

    /// Appends every event from now on to `path` as JSON lines (replacing the file
    /// configured by `events_file`, if any).
    ///
    /// A writer thread does the appending: a transition only queues its line (up to 1024
    /// lines behind; past that, events are dropped, counted in
    /// [`event_log_dropped`](Self::event_log_dropped) and logged as a warning).
    pub fn log_events_to(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        let log = open_log(path.as_ref())?;
        self.inner.core.events.set_log(log);
        Ok(())
    }

    /// Blocks until the event file holds every event emitted so far (at shutdown, or
    /// before reading the file). Returns at once without an event file.
    pub fn flush_event_log(&self) {
        self.inner.core.events.flush_log();
    }

    /// Events not written to the event file because its writer was behind.
    pub fn event_log_dropped(&self) -> u64 {
        self.inner.core.events.log_dropped()
    }

    /// `circuit_breaker_transitions_total{key,from,to}`: the transitions and overrides of
    /// every breaker held, sorted by key, then from and to. An evicted breaker takes its
    /// counts with it (into [`evicted_counts`](Self::evicted_counts)); a key that comes
    /// back starts from zero.
    pub fn transition_counts(&self) -> Vec<TransitionCount> {
        let mut out = Vec::new();
        for s in self.all() {
            let mut tally = s.transition_counts();
            tally.sort_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
            out.extend(tally.into_iter().map(|(from, to, count)| TransitionCount {
                key: Arc::clone(&s.key),
                from,
                to,
                count,
            }));
        }
        out
    }

    /// The counts of the breakers no longer held, summed over keys: evicted breakers (as
    /// they were when evicted) and the breakers of calls that overflowed a full registry.
    /// With [`transition_counts`](Self::transition_counts) and each status's
    /// `rejections`, every transition and rejection since the registry was built. Read
    /// it before those two: a breaker evicted in between is then missed for one
    /// reading, never counted twice.
    pub fn evicted_counts(&self) -> EvictedCounts {
        self.inner.core.evicted_counts()
    }

    /// `circuit_breaker_rejections_total{key}` for `key` (0 for a key not held).
    pub fn rejections(&self, key: &str) -> u64 {
        self.find(key).map_or(0, |s| s.rejections())
    }

    /// The bytes one breaker of this registry takes: its state and its window (not the
    /// key string nor the map entry).
    pub fn memory_per_breaker(&self) -> usize {
        BreakerState::new(Arc::from(""), Arc::clone(&self.inner.core), true).memory_bytes()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Opens `path` for appending and starts its writer thread.
fn open_log(path: &Path) -> std::io::Result<EventLog> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    EventLog::start(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry holding `max_keys` breakers forced open: none can be evicted.
    fn full_of_open_breakers(max_keys: usize) -> BreakerRegistry {
        let registry = BreakerRegistry::new(BreakerConfig {
            max_keys,
            ..BreakerConfig::default()
        })
        .unwrap();
        for i in 0..max_keys {
            registry.force_open(&format!("open-{i}"));
        }
        registry
    }

    fn burst(registry: &BreakerRegistry, from: usize, n: usize) {
        for i in from..from + n {
            let s = registry.get_or_insert(&format!("new-{i}"));
            assert!(
                s.evicted.load(Ordering::SeqCst),
                "not kept: the registry is full"
            );
        }
    }

    fn sweeps(registry: &BreakerRegistry) -> u64 {
        registry.inner.sweeps.load(Ordering::Relaxed)
    }

    #[tokio::test(start_paused = true)]
    async fn new_keys_on_a_full_unevictable_registry_sweep_at_most_once_per_interval() {
        let registry = full_of_open_breakers(10_000);
        burst(&registry, 0, 1_000);
        assert_eq!(
            sweeps(&registry),
            1,
            "one sweep for a burst of 1,000 new keys"
        );
        assert_eq!(registry.overflowed(), 1_000);

        tokio::time::advance(SWEEP_INTERVAL / 2).await;
        burst(&registry, 1_000, 1_000);
        assert_eq!(sweeps(&registry), 1, "not again within the interval");

        tokio::time::advance(SWEEP_INTERVAL / 2).await;
        burst(&registry, 2_000, 1_000);
        assert_eq!(sweeps(&registry), 2, "once more after it");

        // A breaker that can go goes at the next sweep, and its room is used.
        registry.reset("open-0");
        tokio::time::advance(SWEEP_INTERVAL).await;
        let s = registry.get_or_insert("fresh");
        assert!(!s.evicted.load(Ordering::SeqCst), "kept");
        assert!(registry.status("open-0").is_none());
        assert_eq!(sweeps(&registry), 3);
        assert_eq!(registry.len(), 10_000);
    }

    #[tokio::test(start_paused = true)]
    async fn insert_keeps_keys_within_max_keys_and_never_counts_an_overflow() {
        let registry = full_of_open_breakers(3);
        assert!(registry.insert("open-1"), "a key held already");
        assert!(!registry.insert("new"), "full of breakers that cannot go");
        assert!(registry.status("new").is_none());
        assert_eq!(registry.len(), 3);
        assert_eq!(
            registry.overflowed(),
            0,
            "no call ran under the overflow breaker"
        );

        // Within the same sweep interval, a breaker that can go makes room at once.
        registry.reset("open-0");
        assert!(registry.insert("new"));
        assert!(
            registry.status("open-0").is_none(),
            "the idle breaker was evicted"
        );
        assert_eq!(registry.state("new"), CircuitState::Closed);
        assert_eq!(registry.len(), 3);

        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert!(
            !BreakerRegistry::default().insert(&long),
            "no call has this key"
        );
    }
}
