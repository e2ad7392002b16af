//! The compartments of a bulkhead: a semaphore and a queue count per key, the bounded
//! map of keys, the permit that frees a slot on drop, and the counters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use toolshield_contract::config::MAX_KEYS;

/// The counters every clone of a layer shares.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) admitted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) queued: AtomicUsize,
    /// Slots and queue places given back in keyed compartments: a full map is walked for
    /// idle compartments only when this moved since a walk that found none.
    released: AtomicU64,
}

/// One compartment.
#[derive(Debug)]
pub(crate) struct Gate {
    sem: Semaphore,
    /// Calls waiting for a slot.
    waiting: AtomicUsize,
    /// Held in a map of keys, which may evict it when idle.
    keyed: bool,
    max_concurrent: usize,
    counters: Arc<Counters>,
}

impl Gate {
    fn new(max_concurrent: usize, keyed: bool, counters: Arc<Counters>) -> Self {
        Gate {
            sem: Semaphore::new(max_concurrent),
            waiting: AtomicUsize::new(0),
            keyed,
            max_concurrent,
            counters,
        }
    }

    /// Counts a slot or queue place given back, after it is: a walk of the map that
    /// reads this count sees the compartment as its user left it.
    fn released(&self) {
        if self.keyed {
            self.counters.released.fetch_add(1, Ordering::Release);
        }
    }

    /// No slot taken and nobody queued; idle unless a caller is between taking the
    /// compartment from the map and entering it, or a user is on its way out.
    fn unused(&self) -> bool {
        self.waiting.load(Ordering::Acquire) == 0
            && self.sem.available_permits() == self.max_concurrent
    }

    /// A slot now, if one is free and nobody waits for it (the semaphore is FIFO and a
    /// queued call joins its queue in `call`: a free permit means an empty queue).
    pub(crate) fn try_enter(self: &Arc<Self>) -> Option<Permit> {
        let p = self.sem.try_acquire().ok()?;
        // Given back by `Permit::drop`, whatever ends the call.
        p.forget();
        Some(Permit::new(Arc::clone(self)))
    }

    /// A place in the queue, if it has room.
    pub(crate) fn try_queue(self: &Arc<Self>, max_queue: usize) -> Option<QueuePlace> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_queue).then_some(n + 1)
            })
            .ok()?;
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        Some(QueuePlace {
            gate: Arc::clone(self),
        })
    }
}

/// A place in a compartment's queue: waits for a slot; freed when dropped (admitted,
/// timed out or cancelled).
pub(crate) struct QueuePlace {
    gate: Arc<Gate>,
}

impl QueuePlace {
    /// Waits for a slot, in FIFO order from its first poll. Dropping the future leaves
    /// the queue.
    pub(crate) fn wait(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Permit>> + Send>> {
        // Boxed: only queued calls pay for it (tokio's acquire future has no name).
        let gate = Arc::clone(&self.gate);
        Box::pin(async move {
            let p = gate.sem.acquire().await.ok()?;
            p.forget();
            Some(Permit::new(gate))
        })
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        self.gate.waiting.fetch_sub(1, Ordering::AcqRel);
        self.gate.counters.queued.fetch_sub(1, Ordering::Relaxed);
        self.gate.released();
    }
}

impl std::fmt::Debug for QueuePlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePlace").finish_non_exhaustive()
    }
}

/// A slot in a compartment, given back when dropped: the call ended, failed, panicked
/// or was cancelled.
pub(crate) struct Permit {
    gate: Arc<Gate>,
}

impl Permit {
    fn new(gate: Arc<Gate>) -> Self {
        gate.counters.admitted.fetch_add(1, Ordering::Relaxed);
        gate.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        Permit { gate }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.gate.sem.add_permits(1);
        self.gate.released();
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").finish_non_exhaustive()
    }
}

/// The longest key held in a compartment of its own, in bytes; longer keys share one.
pub(crate) const MAX_KEY_LEN: usize = 4096;

/// The compartments of a layer.
#[derive(Debug)]
pub(crate) enum Gates {
    One(Arc<Gate>),
    Keyed(KeyedGates),
}

#[derive(Debug)]
pub(crate) struct KeyedGates {
    map: Mutex<Compartments>,
    /// The compartment every key longer than [`MAX_KEY_LEN`] shares: never in the map.
    overflow: Arc<Gate>,
    max_keys: usize,
    max_concurrent: usize,
    counters: Arc<Counters>,
}

#[derive(Debug)]
struct Compartments {
    /// `None` is the compartment of calls without a key.
    map: HashMap<Option<Arc<str>>, Arc<Gate>>,
    /// [`Counters::released`] when a walk of the full map last found no idle
    /// compartment and none on its way to idle: until a slot or queue place is given
    /// back, another walk would find none either, so a flood of new keys against busy
    /// compartments costs each call one lookup, not a walk of the map.
    walked_at: u64,
}

impl KeyedGates {
    /// The compartment of `key`, created if needed; `None` when `max_keys` compartments
    /// are held and every one of them is busy.
    pub(crate) fn gate(&self, key: Option<&str>) -> Option<Arc<Gate>> {
        let mut guard = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let c = &mut *guard;
        if let Some(g) = c.map.get(&key as &dyn Lookup) {
            return Some(Arc::clone(g));
        }
        if key.is_some_and(|k| k.len() > MAX_KEY_LEN) {
            // Limited together, never held: the map stays within `max_keys` short keys.
            return Some(Arc::clone(&self.overflow));
        }
        if c.map.len() >= self.max_keys {
            // Read before the walk: a user found here that gives its slot back later
            // moves the count past this value, and the next new key walks again.
            let released = self.counters.released.load(Ordering::Acquire);
            if released == c.walked_at {
                return None;
            }
            // An idle compartment is held by the map alone (every permit, queue place
            // and caller entering it holds a clone), and only this lock hands it out:
            // dropping it forgets nothing that matters.
            let mut settled = true;
            c.map.retain(|_, g| {
                if Arc::strong_count(g) == 1 {
                    return false;
                }
                // Unused yet held: a caller entering it, or one whose slot is given
                // back but whose clone is not dropped yet, which counts nothing when
                // it is: the next new key walks again.
                settled &= !g.unused();
                true
            });
            if c.map.len() >= self.max_keys {
                if settled {
                    c.walked_at = released;
                }
                return None;
            }
        }
        let gate = Arc::new(Gate::new(
            self.max_concurrent,
            true,
            Arc::clone(&self.counters),
        ));
        c.map.insert(key.map(Arc::from), Arc::clone(&gate));
        Some(gate)
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).map.len()
    }
}

/// Looks up an `Option<Arc<str>>` key by `Option<&str>` without allocating.
trait Lookup {
    fn as_key(&self) -> Option<&str>;
}

impl Lookup for Option<Arc<str>> {
    fn as_key(&self) -> Option<&str> {
        self.as_deref()
    }
}

impl Lookup for Option<&str> {
    fn as_key(&self) -> Option<&str> {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn Lookup + 'a> for Option<Arc<str>> {
    fn borrow(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

impl PartialEq for dyn Lookup + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.as_key() == other.as_key()
    }
}

impl Eq for dyn Lookup + '_ {}

impl std::hash::Hash for dyn Lookup + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_key().hash(state);
    }
}

impl Gates {
    pub(crate) fn one(max_concurrent: usize, counters: Arc<Counters>) -> Self {
        Gates::One(Arc::new(Gate::new(max_concurrent, false, counters)))
    }

    pub(crate) fn keyed(max_concurrent: usize, max_keys: usize, counters: Arc<Counters>) -> Self {
        Gates::Keyed(KeyedGates {
            map: Mutex::new(Compartments {
                map: HashMap::new(),
                walked_at: u64::MAX,
            }),
            overflow: Arc::new(Gate::new(max_concurrent, false, Arc::clone(&counters))),
            max_keys: max_keys.clamp(1, MAX_KEYS),
            max_concurrent,
            counters,
        })
    }
}

/// The settings of a layer, resolved once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_concurrent: usize,
    pub(crate) max_queue: usize,
    pub(crate) queue_timeout: Duration,
}
