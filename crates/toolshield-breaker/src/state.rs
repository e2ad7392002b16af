//! The state of one breaker: a state word, a probe word, a window of outcomes, all in
//! atomics. Transitions take a per-breaker lock; admitting and recording in the closed
//! state never do.

use std::sync::Arc;
use std::time::Duration;

// The atomics and the transition lock come from loom when its model checker runs the
// state machine (`src/loom_model.rs`); everything else is plain std.
#[cfg(all(test, toolshield_loom))]
use loom::sync::{
    atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    Mutex,
};
#[cfg(not(all(test, toolshield_loom)))]
use std::sync::{
    atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    Mutex,
};

use std::time::SystemTime;
use tokio::time::Instant;

use crate::config::{BreakerConfig, WindowConfig};
use crate::events::{BreakerEvent, CircuitState, EventHub, EvictedCounts, TransitionReason};

const ST_CLOSED: u8 = 0;
const ST_OPEN: u8 = 1;
const ST_HALF_OPEN: u8 = 2;

const M_NORMAL: u8 = 0;
const M_FORCED_OPEN: u8 = 1;
const M_DISABLED: u8 = 2;
const M_METRICS_ONLY: u8 = 3;

#[inline]
const fn pack(epoch: u32, mode: u8, state: u8) -> u64 {
    ((epoch as u64) << 32) | ((mode as u64) << 8) | state as u64
}

/// The mode and state bytes of the state word.
const MODE_STATE: u64 = 0xFFFF;

#[inline]
const fn unpack(word: u64) -> (u32, u8, u8) {
    ((word >> 32) as u32, (word >> 8) as u8, word as u8)
}

#[inline]
const fn pack_probes(epoch: u32, successes: u32, in_flight: u32) -> u64 {
    ((epoch as u64) << 32) | (((successes & 0xFFFF) as u64) << 16) | (in_flight & 0xFFFF) as u64
}

#[inline]
const fn unpack_probes(word: u64) -> (u32, u32, u32) {
    (
        (word >> 32) as u32,
        ((word >> 16) & 0xFFFF) as u32,
        (word & 0xFFFF) as u32,
    )
}

/// Whether epoch `a` is older than `b` (wrapping).
#[inline]
fn older(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

fn auto_state(state: u8) -> CircuitState {
    match state {
        ST_OPEN => CircuitState::Open,
        ST_HALF_OPEN => CircuitState::HalfOpen,
        _ => CircuitState::Closed,
    }
}

fn effective(mode: u8, state: u8) -> CircuitState {
    match mode {
        M_FORCED_OPEN => CircuitState::ForcedOpen,
        M_DISABLED => CircuitState::Disabled,
        M_METRICS_ONLY => CircuitState::MetricsOnly,
        _ => auto_state(state),
    }
}

/// Transition counts of one breaker: `(from, to, count)`, in the order first seen. A
/// breaker goes through a handful of the 36 pairs, so a short list beats a table.
type Tally = Vec<(CircuitState, CircuitState, u64)>;

#[inline]
fn bump(tally: &mut Tally, from: CircuitState, to: CircuitState) {
    match tally.iter_mut().find(|(f, t, _)| *f == from && *t == to) {
        Some((_, _, n)) => *n = n.saturating_add(1),
        None => tally.push((from, to, 1)),
    }
}

/// What the breakers a registry no longer holds had counted, summed over keys: a fixed
/// table, so keys that come and go cannot grow it.
#[derive(Default)]
struct Retired {
    rejections: u64,
    /// `[from][to]`, in the order of [`CircuitState::ALL`].
    transitions: [[u64; STATES]; STATES],
}

const STATES: usize = CircuitState::ALL.len();

/// What every breaker of a registry shares: the config, the event hub, the clock base.
pub(crate) struct Core {
    pub(crate) config: BreakerConfig,
    pub(crate) events: EventHub,
    retired: Mutex<Retired>,
    /// Open-state shared by other processes; asked only by a closed breaker admitting a call.
    pub(crate) shared: std::sync::OnceLock<Arc<dyn crate::shared::SharedOpenState>>,
    base: Instant,
    base_wall: SystemTime,
    slow_rate: Option<f64>,
}

impl Core {
    pub(crate) fn new(config: BreakerConfig, events: EventHub) -> Self {
        Core {
            slow_rate: config.slow_call_rate,
            config,
            events,
            retired: Mutex::new(Retired::default()),
            shared: std::sync::OnceLock::new(),
            base: Instant::now(),
            base_wall: SystemTime::now(),
        }
    }

    /// Nanoseconds since the registry was built, on tokio's clock (pausable in tests).
    #[inline]
    pub(crate) fn now_nanos(&self) -> u64 {
        let d = toolshield_contract::time::now().saturating_duration_since(self.base);
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }

    fn retire(&self, tally: &Tally, rejections: u64) {
        if tally.is_empty() && rejections == 0 {
            return;
        }
        let mut r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        r.rejections = r.rejections.saturating_add(rejections);
        for &(from, to, n) in tally {
            let cell = &mut r.transitions[from as usize][to as usize];
            *cell = cell.saturating_add(n);
        }
    }

    /// The counts of every breaker retired so far.
    pub(crate) fn evicted_counts(&self) -> EvictedCounts {
        let r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        let mut transitions = Vec::new();
        for from in CircuitState::ALL {
            for to in CircuitState::ALL {
                let n = r.transitions[from as usize][to as usize];
                if n > 0 {
                    transitions.push((from, to, n));
                }
            }
        }
        EvictedCounts {
            rejections: r.rejections,
            transitions,
        }
    }

    fn wall(&self, nanos: u64) -> SystemTime {
        let d = Duration::from_nanos(nanos);
        self.base_wall.checked_add(d).unwrap_or(self.base_wall)
    }
}

/// Outcomes of the last N calls: two bitsets (failure, slow) in atomics, each bit change
/// paired with a counter change computed from the bit's previous value, so the counters
/// always equal the number of set bits once the writers are done.
struct CountWindow {
    size: u64,
    words: usize,
    pos: AtomicU64,
    failures: AtomicU32,
    slows: AtomicU32,
    bits: Box<[AtomicU64]>,
}

/// Calls, failures and slow calls per time bucket, packed into one `AtomicU64` each:
/// `[bucket tag: 16 | calls: 16 | failures: 16 | slow: 16]`, and the newest bucket
/// index recorded (`head`).
///
/// A 16-bit tag alone wraps: a slot last written 65,536 buckets ago would read as
/// current. So whoever moves `head` forward clears the slots of the buckets it skipped
/// (every slot after a gap of a whole window): each slot then holds nothing or one of the
/// last `n` buckets before `head`, which bucket is known from the slot's position, and the
/// tag only has to tell apart buckets less than two windows apart (`2n <= 8,192`, since
/// `n <= 4,096`), which 16 bits always do.
struct TimeWindow {
    bucket_nanos: u64,
    /// The newest bucket index recorded (0 before the first record: the slots are empty).
    head: AtomicU64,
    buckets: Box<[AtomicU64]>,
}

enum Window {
    Count(CountWindow),
    Time(TimeWindow),
}

/// What the window holds after a record.
#[derive(Clone, Copy, Default)]
struct Snapshot {
    calls: u32,
    failures: u32,
    slows: u32,
}

#[inline]
fn set_bit(word: &AtomicU64, bit: u64, value: bool, count: &AtomicU32) {
    if value {
        let old = word.fetch_or(bit, Ordering::AcqRel);
        if old & bit == 0 {
            count.fetch_add(1, Ordering::AcqRel);
        }
    } else if word.load(Ordering::Relaxed) & bit != 0 {
        let old = word.fetch_and(!bit, Ordering::AcqRel);
        if old & bit != 0 {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[inline]
fn read_count(count: &AtomicU32, max: u64) -> u32 {
    // The counter may dip below zero for an instant when two writers race on one slot.
    let v = count.load(Ordering::Acquire) as i32;
    (v.max(0) as u64).min(max) as u32
}

impl CountWindow {
    fn new(size: u32) -> Self {
        let words = (size as usize).div_ceil(64);
        CountWindow {
            size: u64::from(size.max(1)),
            words,
            pos: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            slows: AtomicU32::new(0),
            bits: (0..words * 2).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether the window is full and holds no failure and no slow call: a fast success
    /// recorded into it would shift a zero into zeros.
    #[inline(always)]
    fn is_quiet(&self) -> bool {
        self.failures.load(Ordering::Relaxed) == 0
            && self.slows.load(Ordering::Relaxed) == 0
            && self.pos.load(Ordering::Relaxed) >= self.size
    }

    /// `None` when nothing changed: a success into a full window without failures or
    /// slow calls shifts zeros into zeros, so it is not written at all.
    #[inline]
    fn record(&self, failure: bool, slow: bool) -> Option<Snapshot> {
        if !failure && !slow && self.is_quiet() {
            return None;
        }
        let p = self.pos.fetch_add(1, Ordering::AcqRel);
        let idx = (p % self.size) as usize;
        let (w, bit) = (idx / 64, 1u64 << (idx % 64));
        set_bit(&self.bits[w], bit, failure, &self.failures);
        set_bit(&self.bits[self.words + w], bit, slow, &self.slows);
        Some(Snapshot {
            calls: (p + 1).min(self.size) as u32,
            failures: read_count(&self.failures, self.size),
            slows: read_count(&self.slows, self.size),
        })
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            calls: self.pos.load(Ordering::Acquire).min(self.size) as u32,
            failures: read_count(&self.failures, self.size),
            slows: read_count(&self.slows, self.size),
        }
    }

    fn clear(&self) {
        for (i, w) in self.bits.iter().enumerate() {
            let old = w.swap(0, Ordering::AcqRel);
            let n = old.count_ones();
            if n > 0 {
                let count = if i < self.words {
                    &self.failures
                } else {
                    &self.slows
                };
                count.fetch_sub(n, Ordering::AcqRel);
            }
        }
        self.pos.store(0, Ordering::Release);
    }
}

const TAG_SHIFT: u32 = 48;
const FIELD: u64 = 0xFFFF;

impl TimeWindow {
    fn new(duration: Duration, buckets: u32) -> Self {
        let buckets = buckets.max(1);
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        TimeWindow {
            bucket_nanos: (nanos / u64::from(buckets)).max(1),
            head: AtomicU64::new(0),
            buckets: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    fn slot(&self, index: u64) -> &AtomicU64 {
        &self.buckets[(index % self.buckets.len() as u64) as usize]
    }

    /// Empties the slots of the buckets after `old` and before `new`, which nobody
    /// recorded into while `head` was at `old` (the slot of `new` is reset by its first
    /// writer, whose tag differs).
    #[cold]
    fn clear_skipped(&self, old: u64, new: u64) {
        let n = self.buckets.len() as u64;
        if new - old >= n {
            // A whole window went by: every slot is stale, whatever its tag says. A record
            // of bucket `new` made meanwhile by another caller may be lost: never a stale
            // one kept.
            for b in self.buckets.iter() {
                b.store(0, Ordering::Release);
            }
            return;
        }
        for index in old + 1..new {
            // Stale content is one window older than `index`, so its tag differs; a late
            // record of `index` itself (its tag) is kept.
            let tag = index & FIELD;
            let _ = self
                .slot(index)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    (v >> TAG_SHIFT != tag).then_some(0)
                });
        }
    }

    fn record(&self, now: u64, failure: bool, slow: bool) -> Snapshot {
        let abs = now / self.bucket_nanos;
        let n = self.buckets.len() as u64;
        let mut head = self.head.load(Ordering::Acquire);
        while abs > head {
            match self
                .head
                .compare_exchange_weak(head, abs, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.clear_skipped(head, abs);
                    head = abs;
                }
                Err(actual) => head = actual,
            }
        }
        if abs.saturating_add(n) <= head {
            // Its bucket left the window while the call ran.
            return self.snapshot(now);
        }
        let slot = self.slot(abs);
        let tag = abs & FIELD;
        let add = (1u64 << 32) | (u64::from(failure) << 16) | u64::from(slow);
        let mut cur = slot.load(Ordering::Acquire);
        let written = loop {
            let new = if cur >> TAG_SHIFT != tag {
                (tag << TAG_SHIFT) | add
            } else if (cur >> 32) & FIELD == FIELD {
                break None; // saturated: the bucket keeps the rates it had
            } else {
                cur + add
            };
            match slot.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break Some(new),
                Err(actual) => cur = actual,
            }
        };
        // The window may have moved a whole window on between the check above and the
        // write, and cleared the slot before it: take the stale write back unless someone
        // wrote after it (they check the same way).
        if let Some(written) = written {
            if abs.saturating_add(n) <= self.head.load(Ordering::Acquire) {
                let _ = slot.compare_exchange(written, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
        self.snapshot(now)
    }

    fn snapshot(&self, now: u64) -> Snapshot {
        let abs = now / self.bucket_nanos;
        let n = self.buckets.len() as u64;
        let head = self.head.load(Ordering::Acquire);
        let mut s = Snapshot::default();
        if abs >= head.saturating_add(n) {
            return s; // nothing recorded for a whole window
        }
        for (j, b) in (0u64..).zip(self.buckets.iter()) {
            let v = b.load(Ordering::Acquire);
            if (v >> 32) & FIELD == 0 {
                continue;
            }
            // The one bucket of the last window before `head` that this slot can hold.
            let Some(index) = head.checked_sub((head % n + n - j) % n) else {
                continue;
            };
            if v >> TAG_SHIFT != index & FIELD || index.saturating_add(n) <= abs {
                continue;
            }
            s.calls += ((v >> 32) & FIELD) as u32;
            s.failures += ((v >> 16) & FIELD) as u32;
            s.slows += (v & FIELD) as u32;
        }
        s
    }

    fn clear(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Release);
        }
    }
}

impl Window {
    fn new(config: &WindowConfig) -> Self {
        match *config {
            WindowConfig::Count { size } => Window::Count(CountWindow::new(size)),
            WindowConfig::Time { duration, buckets } => {
                Window::Time(TimeWindow::new(duration, buckets))
            }
        }
    }

    fn clear(&self) {
        match self {
            Window::Count(w) => w.clear(),
            Window::Time(w) => w.clear(),
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Window::Count(w) => w.bits.len() * 8,
            Window::Time(w) => w.buckets.len() * 8,
        }
    }
}

/// How an admitted call is to be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TicketKind {
    /// Admitted while closed: recorded into the window.
    Closed,
    /// A half-open probe holding a permit.
    Probe,
    /// A call of a metrics-only breaker in shadow half-open: decides like a probe, holds
    /// no permit.
    ShadowProbe,
    /// A call of a metrics-only breaker in shadow open: not recorded.
    Untracked,
}

/// The admission of one call, remembered until its outcome is known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    pub(crate) epoch: u32,
    pub(crate) kind: TicketKind,
}

/// The outcome of a call as the breaker records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    Success { slow: bool },
    Failure { slow: bool },
    Ignore,
}

/// One breaker.
pub(crate) struct BreakerState {
    /// `[epoch: 32 | unused: 16 | mode: 8 | state: 8]`; changed only under `lock`.
    word: AtomicU64,
    /// `[epoch: 32 | successes: 16 | probes in flight: 16]`; valid for the half-open
    /// epoch it names, zero for any other.
    probes: AtomicU64,
    consecutive: AtomicU32,
    /// Opens without a close in between (for the growing wait); under `lock`.
    opens: AtomicU32,
    pub(crate) touched: AtomicBool,
    pub(crate) evicted: AtomicBool,
    /// Held by a layer built for this one key ([`BreakerLayer::pin_key`](crate::BreakerLayer::pin_key)):
    /// never evicted.
    pub(crate) pinned: AtomicBool,
    /// Never held by the registry (a call that overflowed a full registry): its counts are
    /// retired when it is dropped.
    unkept: bool,
    open_until: AtomicU64,
    /// Nanoseconds since the registry's base, plus one; 0 for never.
    last_failure: AtomicU64,
    rejections: AtomicU64,
    window: Window,
    /// The transition lock: held while the state word changes and while the event of the
    /// change is delivered, so the events of one key arrive in transition order. An event
    /// callback that calls this breaker again runs on the thread holding it: see
    /// [`locked`](Self::locked).
    lock: Mutex<()>,
    /// The transition counts of this breaker (`circuit_breaker_transitions_total{key,from,to}`),
    /// which go with the breaker when it is evicted. Its own lock, held for a moment only,
    /// so an event callback may read them.
    counts: Mutex<Tally>,
    pub(crate) key: Arc<str>,
    /// `slow_call_duration` in nanoseconds (`u64::MAX` for none: no call is that slow),
    /// copied from the config so the call path reads it next to the state word instead
    /// of through `core`.
    slow_threshold: u64,
    core: Arc<Core>,
}

impl Drop for BreakerState {
    fn drop(&mut self) {
        if self.unkept {
            let tally = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            self.core
                .retire(&tally, self.rejections.load(Ordering::Relaxed));
        }
    }
}

impl BreakerState {
    /// The breaker every call of a full registry runs under when its key cannot be kept:
    /// never held by the map, disabled (it admits every call and never trips), so a call
    /// that overflows costs no allocation and one overflowed key never rejects another's.
    pub(crate) fn overflow(core: Arc<Core>) -> Self {
        let state = Self::new(Arc::from("other"), core, false);
        state
            .word
            .store(pack(0, M_DISABLED, ST_CLOSED), Ordering::Release);
        state
    }

    /// A breaker the registry holds (`kept`) or one for a single overflowed call.
    pub(crate) fn new(key: Arc<str>, core: Arc<Core>, kept: bool) -> Self {
        BreakerState {
            word: AtomicU64::new(pack(0, M_NORMAL, ST_CLOSED)),
            probes: AtomicU64::new(0),
            consecutive: AtomicU32::new(0),
            opens: AtomicU32::new(0),
            touched: AtomicBool::new(true),
            evicted: AtomicBool::new(!kept),
            pinned: AtomicBool::new(false),
            unkept: !kept,
            open_until: AtomicU64::new(0),
            last_failure: AtomicU64::new(0),
            rejections: AtomicU64::new(0),
            window: Window::new(&core.config.window),
            lock: Mutex::new(()),
            counts: Mutex::new(Vec::new()),
            key,
            slow_threshold: core.config.slow_call_duration.map_or(u64::MAX, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
            }),
            core,
        }
    }

    /// Bytes one breaker takes: the struct and its window (the key string and the
    /// registry's map entry not included).
    pub(crate) fn memory_bytes(&self) -> usize {
        let tally = self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .capacity();
        std::mem::size_of::<Self>()
            + self.window.heap_bytes()
            + tally * std::mem::size_of::<(CircuitState, CircuitState, u64)>()
    }

    /// This breaker's transition counts, `(from, to, count)`.
    pub(crate) fn transition_counts(&self) -> Tally {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Adds this breaker's counts to the registry's totals of breakers no longer held
    /// (called once, by the sweep that evicted it).
    pub(crate) fn retire(&self) {
        let tally = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        self.core.retire(&tally, self.rejections());
    }

    /// The breaker's own slow-call threshold, if configured.
    #[inline]
    pub(crate) fn slow_threshold_nanos(&self) -> Option<u64> {
        (self.slow_threshold != u64::MAX).then_some(self.slow_threshold)
    }

    /// The registry clock.
    #[inline]
    pub(crate) fn now_nanos(&self) -> u64 {
        self.core.now_nanos()
    }

    /// Marks the breaker as used; `false` if the registry has evicted it (the caller
    /// must look the key up again). The two SeqCst pairs (touched/evicted here,
    /// evicted/touched in the sweep) make sure one side sees the other.
    #[inline]
    pub(crate) fn touch(&self) -> bool {
        if !self.touched.load(Ordering::SeqCst) {
            self.touched.store(true, Ordering::SeqCst);
        }
        !self.evicted.load(Ordering::SeqCst)
    }

    /// Whether the registry no longer holds this breaker (evicted, or never held: a
    /// call that overflowed a full registry).
    #[inline(always)]
    pub(crate) fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Whether the sweep may evict it: not pinned, no manual override, and closed; or, when the
    /// registry is full (`full`), open with its wait over or half-open with no probe in
    /// flight (its next call would only probe; an idle key whose failures are that old
    /// starts afresh, so a flood of keys that failed once and are never called again, or
    /// whose one probe was dropped or ignored, cannot pin the registry full).
    pub(crate) fn evictable(&self, full: bool) -> bool {
        let (_, mode, state) = unpack(self.word.load(Ordering::Acquire));
        !self.pinned.load(Ordering::Acquire)
            && mode == M_NORMAL
            && (state == ST_CLOSED
                || full
                    && match state {
                        ST_OPEN => self.now_nanos() >= self.open_until.load(Ordering::Acquire),
                        _ => unpack_probes(self.probes.load(Ordering::Acquire)).2 == 0,
                    })
    }

    /// Admits a call, or says how long to wait (`None` when unknown).
    ///
    /// The closed state under no override, with no other process holding the key open,
    /// is one load of the state word and one of the shared open-state hook, inlined into
    /// the caller; every other state takes [`admit_slow`](Self::admit_slow).
    #[inline(always)]
    pub(crate) fn admit(&self) -> Result<Ticket, Option<Duration>> {
        let word = self.word.load(Ordering::Acquire);
        if word & MODE_STATE == pack(0, M_NORMAL, ST_CLOSED) && self.core.shared.get().is_none() {
            return Ok(Ticket {
                epoch: unpack(word).0,
                kind: TicketKind::Closed,
            });
        }
        self.admit_slow()
    }

    /// [`admit`](Self::admit) in every case but a closed breaker without an override or
    /// shared open-state. Not marked cold: a registry that shares open-state with other
    /// processes takes it on every call.
    #[inline(never)]
    fn admit_slow(&self) -> Result<Ticket, Option<Duration>> {
        loop {
            let word = self.word.load(Ordering::Acquire);
            let (epoch, mode, state) = unpack(word);
            if mode == M_FORCED_OPEN {
                self.rejections.fetch_add(1, Ordering::Relaxed);
                return Err(None);
            }
            match state {
                ST_CLOSED => {
                    if mode == M_NORMAL {
                        if let Some(wait) =
                            self.core.shared.get().and_then(|s| s.open_for(&self.key))
                        {
                            self.rejections.fetch_add(1, Ordering::Relaxed);
                            return Err(Some(wait));
                        }
                    }
                    return Ok(Ticket {
                        epoch,
                        kind: TicketKind::Closed,
                    });
                }
                ST_OPEN => {
                    let now = self.core.now_nanos();
                    let until = self.open_until.load(Ordering::Acquire);
                    if now >= until {
                        self.transition(
                            epoch,
                            ST_OPEN,
                            ST_HALF_OPEN,
                            TransitionReason::WaitElapsed,
                            now,
                        );
                        continue;
                    }
                    if mode == M_METRICS_ONLY {
                        return Ok(Ticket {
                            epoch,
                            kind: TicketKind::Untracked,
                        });
                    }
                    self.rejections.fetch_add(1, Ordering::Relaxed);
                    return Err(Some(Duration::from_nanos(until - now)));
                }
                _ => {
                    if mode == M_METRICS_ONLY {
                        return Ok(Ticket {
                            epoch,
                            kind: TicketKind::ShadowProbe,
                        });
                    }
                    if self.acquire_permit(epoch) {
                        // The phase this permit was taken for may have been decided
                        // (its probes' outcomes moved the breaker) or overridden since
                        // the state word was read: give it back and look again.
                        if self.word.load(Ordering::Acquire) != word {
                            self.release_permit(epoch);
                            continue;
                        }
                        return Ok(Ticket {
                            epoch,
                            kind: TicketKind::Probe,
                        });
                    }
                    if self.word.load(Ordering::Acquire) != word {
                        continue;
                    }
                    self.rejections.fetch_add(1, Ordering::Relaxed);
                    return Err(None);
                }
            }
        }
    }

    /// Takes a probe permit. The count of probes in flight survives epochs: a probe of
    /// an earlier half-open phase still running holds its permit, so no more than K
    /// probes ever run at once.
    fn acquire_permit(&self, epoch: u32) -> bool {
        let k = self.core.config.half_open_permits;
        let mut cur = self.probes.load(Ordering::Acquire);
        loop {
            let (e, successes, in_flight) = unpack_probes(cur);
            if older(epoch, e) {
                return false;
            }
            let successes = if e == epoch { successes } else { 0 };
            if in_flight >= k {
                return false;
            }
            let new = pack_probes(epoch, successes, in_flight + 1);
            match self
                .probes
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Releases a permit (`release`) and counts a success of `epoch` (`success`).
    /// Returns the successes of `epoch` after the update, or `None` when that half-open
    /// phase is over.
    fn update_probes(&self, epoch: u32, release: bool, success: bool) -> Option<u32> {
        let mut cur = self.probes.load(Ordering::Acquire);
        loop {
            let (e, successes, in_flight) = unpack_probes(cur);
            let in_flight = if release {
                in_flight.saturating_sub(1)
            } else {
                in_flight
            };
            let (e, successes, current) = if older(epoch, e) {
                (e, successes, false)
            } else {
                let base = if e == epoch { successes } else { 0 };
                (epoch, base + u32::from(success), true)
            };
            let new = pack_probes(e, successes.min(0xFFFF), in_flight);
            match self
                .probes
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return current.then_some(successes),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives back a probe permit without recording anything (dropped or ignored probe).
    pub(crate) fn release_permit(&self, epoch: u32) {
        self.update_probes(epoch, true, false);
    }

    /// Records the outcome of an admitted call.
    ///
    /// A fast success admitted while closed, into a full count window holding no failure
    /// and no slow call, after no failure in a row, changes nothing (it would shift a zero
    /// into zeros): it is four loads, inlined into the caller, and writes nothing. Every
    /// other outcome takes [`record_slow`](Self::record_slow).
    #[inline(always)]
    pub(crate) fn record(&self, ticket: Ticket, record: Record) {
        if ticket.kind == TicketKind::Closed
            && record == (Record::Success { slow: false })
            && self.consecutive.load(Ordering::Relaxed) == 0
            && matches!(&self.window, Window::Count(w) if w.is_quiet())
        {
            return;
        }
        self.record_slow(ticket, record);
    }

    /// [`record`](Self::record) of every outcome that may change something.
    #[inline(never)]
    fn record_slow(&self, ticket: Ticket, record: Record) {
        match ticket.kind {
            TicketKind::Untracked => {}
            TicketKind::Closed => self.record_closed(ticket.epoch, record),
            TicketKind::Probe | TicketKind::ShadowProbe => {
                // The permit is given back when this returns (or unwinds: an event
                // callback may panic), so after the outcome has moved the breaker, if it
                // does: a permit freed before that would admit one more probe into a
                // phase already decided (`admit_slow` checks the phase again after
                // taking a permit).
                let _permit = (ticket.kind == TicketKind::Probe).then_some(Permit {
                    breaker: self,
                    epoch: ticket.epoch,
                });
                let slow_counts = self.core.slow_rate.is_some();
                match record {
                    Record::Ignore => {}
                    Record::Success { slow } if !(slow && slow_counts) => {
                        let done = self.update_probes(ticket.epoch, false, true);
                        if done.is_some_and(|s| s >= self.core.config.half_open_successes) {
                            let now = self.core.now_nanos();
                            self.transition(
                                ticket.epoch,
                                ST_HALF_OPEN,
                                ST_CLOSED,
                                TransitionReason::ProbesSucceeded,
                                now,
                            );
                        }
                    }
                    Record::Success { .. } | Record::Failure { .. } => {
                        let reason = if matches!(record, Record::Failure { .. }) {
                            TransitionReason::ProbeFailed
                        } else {
                            TransitionReason::ProbeSlow
                        };
                        // The failure time is stored by the transition, under its lock and
                        // only if the probe's phase is still current: a probe of a phase
                        // a reset or an override ended must not show in the status.
                        let now = self.core.now_nanos();
                        self.transition(ticket.epoch, ST_HALF_OPEN, ST_OPEN, reason, now);
                    }
                }
            }
        }
    }

    #[inline]
    fn record_closed(&self, epoch: u32, record: Record) {
        let (failure, slow) = match record {
            Record::Ignore => return,
            Record::Success { slow } => (false, slow),
            Record::Failure { slow } => (true, slow),
        };
        let (cur_epoch, mode, _) = unpack(self.word.load(Ordering::Acquire));
        if cur_epoch != epoch {
            return; // admitted before a transition: its outcome belongs to a past phase
        }
        let cfg = &self.core.config;
        let mut now = None;
        let consecutive = if failure {
            let n = self.core.now_nanos();
            now = Some(n);
            self.last_failure.store(n + 1, Ordering::Relaxed);
            self.consecutive
                .fetch_add(1, Ordering::AcqRel)
                .saturating_add(1)
        } else {
            if self.consecutive.load(Ordering::Relaxed) != 0 {
                self.consecutive.store(0, Ordering::Release);
            }
            0
        };
        let snap = match &self.window {
            Window::Count(w) => w.record(failure, slow),
            Window::Time(w) => {
                let n = *now.get_or_insert_with(|| self.core.now_nanos());
                Some(w.record(n, failure, slow))
            }
        };
        if mode == M_DISABLED {
            return;
        }
        let reason =
            if failure && cfg.consecutive_failures > 0 && consecutive >= cfg.consecutive_failures {
                Some(TransitionReason::ConsecutiveFailures)
            } else if let Some(s) = snap {
                self.rate_trip(s)
            } else {
                None
            };
        if let Some(reason) = reason {
            let now = now.unwrap_or_else(|| self.core.now_nanos());
            self.transition(epoch, ST_CLOSED, ST_OPEN, reason, now);
        }
    }

    fn rate_trip(&self, s: Snapshot) -> Option<TransitionReason> {
        let cfg = &self.core.config;
        if s.calls == 0 || s.calls < cfg.min_calls {
            return None;
        }
        let calls = f64::from(s.calls);
        if s.failures > 0 && f64::from(s.failures) * 100.0 >= cfg.failure_rate * calls {
            return Some(TransitionReason::FailureRate);
        }
        match self.core.slow_rate {
            Some(rate) if s.slows > 0 && f64::from(s.slows) * 100.0 >= rate * calls => {
                Some(TransitionReason::SlowCallRate)
            }
            _ => None,
        }
    }

    fn clear_counts(&self) {
        self.window.clear();
        self.consecutive.store(0, Ordering::Release);
    }

    /// Runs `change` (a transition or an override, which returns the event it made, if
    /// any) with the transition lock held, then delivers the event, the lock still held.
    ///
    /// An event callback may call this breaker again (reset it, call the service, read its
    /// counts): the thread delivering already holds the lock, so such a nested change runs
    /// without taking it again (it could not: the lock is not reentrant), and its event is
    /// delivered by the outer call once the current event has reached every sink, so every
    /// sink still sees one key's events in transition order.
    fn locked<R>(&self, change: impl FnOnce() -> (R, Option<BreakerEvent>)) -> R {
        let me = std::ptr::from_ref(self) as usize;
        if delivery::holds(me) {
            let (result, event) = change();
            if let Some(event) = event {
                delivery::defer(me, event);
            }
            return result;
        }
        let _lock = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let (result, event) = change();
        if let Some(event) = event {
            // Taken off this thread's list when done, also when a callback panics (the
            // events deferred meanwhile are then dropped undelivered).
            let delivering = delivery::Delivering::enter(me);
            let mut next = Some(event);
            while let Some(event) = next {
                self.core.events.emit(event);
                next = delivering.next();
            }
        }
        result
    }

    fn count(&self, from: CircuitState, to: CircuitState) {
        bump(
            &mut self.counts.lock().unwrap_or_else(|e| e.into_inner()),
            from,
            to,
        );
    }

    /// Moves from `from` (in `epoch`) to `to`; does nothing if the breaker moved on
    /// meanwhile or is under a manual override other than metrics-only.
    fn transition(&self, epoch: u32, from: u8, to: u8, reason: TransitionReason, now: u64) -> bool {
        self.locked(|| {
            let (cur_epoch, mode, state) = unpack(self.word.load(Ordering::Acquire));
            if cur_epoch != epoch || state != from || !(mode == M_NORMAL || mode == M_METRICS_ONLY)
            {
                return (false, None);
            }
            if reason == TransitionReason::ProbeFailed {
                self.last_failure
                    .store(now.saturating_add(1), Ordering::Relaxed);
            }
            match to {
                ST_OPEN => {
                    let opens = self.opens.load(Ordering::Relaxed).saturating_add(1);
                    self.opens.store(opens, Ordering::Relaxed);
                    let wait = self.core.config.wait_for(opens);
                    let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
                    self.open_until
                        .store(now.saturating_add(wait), Ordering::Release);
                }
                ST_CLOSED => {
                    self.opens.store(0, Ordering::Relaxed);
                    self.clear_counts();
                }
                _ => {}
            }
            self.word
                .store(pack(epoch.wrapping_add(1), mode, to), Ordering::Release);
            self.count(auto_state(from), auto_state(to));
            let event = BreakerEvent {
                at: SystemTime::now(),
                key: Arc::clone(&self.key),
                from: auto_state(from),
                to: auto_state(to),
                reason,
                shadow: mode == M_METRICS_ONLY,
            };
            (true, Some(event))
        })
    }

    /// A manual override: a fresh window, and the new mode.
    pub(crate) fn set_mode(&self, override_: Override) {
        self.locked(|| {
            let (epoch, mode, state) = unpack(self.word.load(Ordering::Acquire));
            let (new_mode, reason) = match override_ {
                Override::ForceOpen => (M_FORCED_OPEN, TransitionReason::ForcedOpen),
                Override::ForceClosed => (M_DISABLED, TransitionReason::ForcedClosed),
                Override::MetricsOnly => (M_METRICS_ONLY, TransitionReason::MetricsOnly),
                Override::Reset => (M_NORMAL, TransitionReason::Reset),
            };
            self.clear_counts();
            self.opens.store(0, Ordering::Relaxed);
            if override_ == Override::Reset {
                self.last_failure.store(0, Ordering::Relaxed);
            }
            self.word.store(
                pack(epoch.wrapping_add(1), new_mode, ST_CLOSED),
                Ordering::Release,
            );
            let (from, to) = (effective(mode, state), effective(new_mode, ST_CLOSED));
            self.count(from, to);
            let event = BreakerEvent {
                at: SystemTime::now(),
                key: Arc::clone(&self.key),
                from,
                to,
                reason,
                shadow: false,
            };
            ((), Some(event))
        });
    }

    /// The effective state.
    pub(crate) fn state(&self) -> CircuitState {
        let (_, mode, state) = unpack(self.word.load(Ordering::Acquire));
        effective(mode, state)
    }

    pub(crate) fn rejections(&self) -> u64 {
        self.rejections.load(Ordering::Relaxed)
    }

    pub(crate) fn status(&self) -> BreakerStatus {
        let (_, mode, state) = unpack(self.word.load(Ordering::Acquire));
        let now = self.core.now_nanos();
        let snap = match &self.window {
            Window::Count(w) => w.snapshot(),
            Window::Time(w) => w.snapshot(now),
        };
        let rate = |n: u32| {
            if snap.calls == 0 {
                0.0
            } else {
                f64::from(n) * 100.0 / f64::from(snap.calls)
            }
        };
        let time_until_half_open =
            (state == ST_OPEN && mode != M_FORCED_OPEN && mode != M_DISABLED).then(|| {
                Duration::from_nanos(self.open_until.load(Ordering::Acquire).saturating_sub(now))
            });
        let last = self.last_failure.load(Ordering::Relaxed);
        let (_, _, in_flight) = unpack_probes(self.probes.load(Ordering::Acquire));
        BreakerStatus {
            key: Arc::clone(&self.key),
            state: effective(mode, state),
            shadow_state: (mode == M_METRICS_ONLY).then(|| auto_state(state)),
            failure_rate: rate(snap.failures),
            slow_call_rate: rate(snap.slows),
            calls_in_window: snap.calls,
            failures_in_window: snap.failures,
            slow_calls_in_window: snap.slows,
            consecutive_failures: self.consecutive.load(Ordering::Acquire),
            last_failure_at: (last != 0).then(|| self.core.wall(last - 1)),
            time_until_half_open,
            probes_in_flight: in_flight,
            rejections: self.rejections(),
        }
    }
}

/// The breakers whose events this thread is delivering (holding their transition lock),
/// each with the events of the changes its callbacks made to it meanwhile, to deliver next.
mod delivery {
    use std::cell::RefCell;
    use std::collections::VecDeque;

    use crate::events::BreakerEvent;

    type Stack = RefCell<Vec<(usize, VecDeque<BreakerEvent>)>>;

    // Under loom the model's threads are not OS threads: its own thread-locals.
    #[cfg(not(all(test, toolshield_loom)))]
    std::thread_local! {
        static DELIVERING: Stack = const { RefCell::new(Vec::new()) };
    }
    #[cfg(all(test, toolshield_loom))]
    loom::thread_local! {
        static DELIVERING: Stack = RefCell::new(Vec::new());
    }

    fn with<R>(f: impl FnOnce(&mut Vec<(usize, VecDeque<BreakerEvent>)>) -> R) -> Option<R> {
        #[cfg(not(all(test, toolshield_loom)))]
        return DELIVERING
            .try_with(|d| d.try_borrow_mut().ok().map(|mut d| f(&mut d)))
            .ok()
            .flatten();
        #[cfg(all(test, toolshield_loom))]
        return DELIVERING.with(|d| d.try_borrow_mut().ok().map(|mut d| f(&mut d)));
    }

    /// Whether this thread holds breaker `id`'s transition lock, delivering its events.
    pub(super) fn holds(id: usize) -> bool {
        with(|d| d.iter().any(|(b, _)| *b == id)).unwrap_or(false)
    }

    /// Queues `event` of breaker `id` for the delivery running on this thread.
    pub(super) fn defer(id: usize, event: BreakerEvent) {
        with(|d| {
            if let Some((_, queue)) = d.iter_mut().rev().find(|(b, _)| *b == id) {
                queue.push_back(event);
            }
        });
    }

    /// This thread delivers the events of breaker `id` while it lives.
    pub(super) struct Delivering(usize);

    impl Delivering {
        pub(super) fn enter(id: usize) -> Self {
            with(|d| d.push((id, VecDeque::new())));
            Delivering(id)
        }

        /// The next event a callback's change queued, if any.
        pub(super) fn next(&self) -> Option<BreakerEvent> {
            with(|d| {
                d.iter_mut()
                    .rev()
                    .find(|(b, _)| *b == self.0)
                    .and_then(|(_, queue)| queue.pop_front())
            })
            .flatten()
        }
    }

    impl Drop for Delivering {
        fn drop(&mut self) {
            with(|d| {
                if let Some(at) = d.iter().rposition(|(b, _)| *b == self.0) {
                    d.remove(at);
                }
            });
        }
    }
}

/// A probe's permit, given back when dropped.
struct Permit<'a> {
    breaker: &'a BreakerState,
    epoch: u32,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.breaker.release_permit(self.epoch);
    }
}

/// A manual action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Override {
    ForceOpen,
    ForceClosed,
    MetricsOnly,
    Reset,
}

/// What one breaker looks like now.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BreakerStatus {
    /// The breaker key.
    pub key: Arc<str>,
    /// The effective state (a manual override shows as its own state).
    pub state: CircuitState,
    /// For a metrics-only breaker, the state its shadow state machine is in.
    pub shadow_state: Option<CircuitState>,
    /// Failures in the window, in percent of the calls in it.
    pub failure_rate: f64,
    /// Slow calls in the window, in percent of the calls in it.
    pub slow_call_rate: f64,
    /// Calls the window holds.
    pub calls_in_window: u32,
    /// Failures the window holds.
    pub failures_in_window: u32,
    /// Slow calls the window holds.
    pub slow_calls_in_window: u32,
    /// Failures in a row.
    pub consecutive_failures: u32,
    /// When the last counted failure happened (wall clock).
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "toolshield_contract::time::serialize_option")
    )]
    pub last_failure_at: Option<SystemTime>,
    /// While open, how long until probes are admitted (zero once the wait is over: the
    /// next call moves the breaker to half-open).
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration::option")
    )]
    pub time_until_half_open: Option<Duration>,
    /// Half-open probes running now.
    pub probes_in_flight: u32,
    /// Calls rejected by this breaker since it was created
    /// (`circuit_breaker_rejections_total{key}`).
    pub rejections: u64,
}
