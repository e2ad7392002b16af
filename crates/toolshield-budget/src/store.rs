//! [`BudgetStore`]: where the counters of a run live, and [`MemoryBudgetStore`], the
//! in-process one.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use toolshield_store::{MemoryBounds, StoreError, StoreFuture, TtlMap, Write};

use crate::config::Scope;

/// The limit a call ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The tool's own `max_calls` in the run.
    ToolCalls,
    /// The run's `run_max_calls`, across every tool.
    RunCalls,
    /// The run's `run_max_cost`, across every tool.
    RunCost,
}

impl Limit {
    /// Every limit, in the order they are checked.
    pub const ALL: [Limit; 3] = [Limit::ToolCalls, Limit::RunCalls, Limit::RunCost];

    /// A stable name (`tool_calls`, `run_calls`, `run_cost`), for metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Limit::ToolCalls => "tool_calls",
            Limit::RunCalls => "run_calls",
            Limit::RunCost => "run_cost",
        }
    }

    /// The store's code of the limit (1, 2, 3), as the Redis script returns it.
    pub const fn code(self) -> u8 {
        match self {
            Limit::ToolCalls => 1,
            Limit::RunCalls => 2,
            Limit::RunCost => 3,
        }
    }

    /// The limit of a store code (1, 2, 3).
    pub const fn from_code(code: i64) -> Option<Limit> {
        match code {
            1 => Some(Limit::ToolCalls),
            2 => Some(Limit::RunCalls),
            3 => Some(Limit::RunCost),
            _ => None,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a store answers to a [`Charge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Verdict {
    /// Every limit had room: the call was counted (the tool's calls, the run's calls and
    /// the run's cost, all at once).
    Admitted,
    /// This limit had no room: nothing was counted.
    Exhausted(Limit),
}

/// Who a budget belongs to: the ids of a call its [`Scope`] needs.
///
/// ```
/// use toolshield_budget::{BudgetKey, Scope};
///
/// let key = BudgetKey::new(Scope::Run, Some("run-1"), Some("alice")).unwrap();
/// let mut s = String::new();
/// key.encode(&mut s);
/// assert_eq!(s, "r:run-1");
/// // `run_and_caller` without a caller has its own namespace, never "unscoped".
/// let a = BudgetKey::new(Scope::RunAndCaller, Some("r"), None).unwrap();
/// let b = BudgetKey::new(Scope::RunAndCaller, Some("r"), Some("-")).unwrap();
/// assert_ne!(a.encoded(), b.encoded());
/// // A scope whose id is missing has no key.
/// assert!(BudgetKey::new(Scope::Caller, Some("run-1"), None).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetKey<'a> {
    scope: Scope,
    run: Option<&'a str>,
    caller: Option<&'a str>,
}

impl<'a> BudgetKey<'a> {
    /// The key of a call with these ids under `scope`; `None` when an id the scope needs
    /// is missing (`run` for `run` and `run_and_caller`, `caller` for `caller`).
    #[must_use]
    pub fn new(scope: Scope, run: Option<&'a str>, caller: Option<&'a str>) -> Option<Self> {
        let ok = match scope {
            Scope::Run | Scope::RunAndCaller => run.is_some(),
            Scope::Caller => caller.is_some(),
        };
        ok.then_some(BudgetKey { scope, run, caller })
    }

    /// The length of the longest id the key holds.
    pub fn longest_id(&self) -> usize {
        let run = match self.scope {
            Scope::Caller => 0,
            _ => self.run.map_or(0, str::len),
        };
        let caller = match self.scope {
            Scope::Run => 0,
            _ => self.caller.map_or(0, str::len),
        };
        run.max(caller)
    }

    /// Appends the encoding of the key to `out`: `r:<run>`, `c:<caller>`, or
    /// `b:<len>:<run>:-` / `b:<len>:<run>:s<len>:<caller>`. Injective: no two distinct
    /// keys (of any scope) share an encoding, whatever the ids contain.
    pub fn encode(&self, out: &mut String) {
        use std::fmt::Write as _;
        match self.scope {
            Scope::Run => {
                out.push_str("r:");
                out.push_str(self.run.unwrap_or_default());
            }
            Scope::Caller => {
                out.push_str("c:");
                out.push_str(self.caller.unwrap_or_default());
            }
            Scope::RunAndCaller => {
                let run = self.run.unwrap_or_default();
                let _ = write!(out, "b:{}:", run.len());
                out.push_str(run);
                match self.caller {
                    None => out.push_str(":-"),
                    Some(caller) => {
                        let _ = write!(out, ":s{}:", caller.len());
                        out.push_str(caller);
                    }
                }
            }
        }
    }

    /// The encoding as a new string (see [`encode`](Self::encode)).
    #[must_use]
    pub fn encoded(&self) -> String {
        let mut s = String::with_capacity(self.longest_id() * 2 + 16);
        self.encode(&mut s);
        s
    }
}

/// One call to count: the key of its run, its tool, and the limits to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge<'a> {
    /// The encoded [`BudgetKey`] of the run.
    pub key: &'a str,
    /// The tool's name (configured, never chosen by the caller).
    pub tool: &'a str,
    /// The tool's limit of calls in the run, if any.
    pub max_calls: Option<u64>,
    /// The cost units the call adds to the run.
    pub cost: u64,
    /// The run's limit of calls across tools, if any.
    pub run_max_calls: Option<u64>,
    /// The run's limit of cost units across tools, if any.
    pub run_max_cost: Option<u64>,
    /// How long the run's counters live after its last call (admitted or not).
    pub ttl: Duration,
}

/// Where the counters of runs live: the ledger asks it to check and count one call,
/// atomically.
///
/// A store must implement [`charge`](Self::charge) as one atomic check-and-increment:
/// the limits are checked in the order of [`Limit::ALL`], and either every counter (the
/// tool's calls, the run's calls, the run's cost) is increased, or none is. The TTL of
/// the run's counters is refreshed by every charge, admitted or not. Concurrent charges
/// of one run, from any number of processes sharing the store, can never admit more
/// calls than a limit allows.
///
/// Implemented by [`MemoryBudgetStore`] and by `toolshield_redis::RedisBudgetStore`.
pub trait BudgetStore: Send + Sync + fmt::Debug {
    /// Checks `charge` against its limits and counts it when every one has room.
    fn charge<'a>(&'a self, charge: Charge<'a>) -> StoreFuture<'a, Verdict>;
}

/// The counters of one run.
///
/// Changed only under the write lock of the run's shard (every charge is one
/// [`TtlMap::update`]), so relaxed loads and stores suffice: the atomics only make the
/// counters readable through the shared reference the map hands out. A run that calls a
/// tool for the first time gets a new value with that tool added.
#[derive(Debug)]
struct Counts {
    calls: AtomicU64,
    cost: AtomicU64,
    /// Calls per tool. Tool names come from configuration, so the list is short.
    tools: Box<[(Arc<str>, AtomicU64)]>,
    /// What the run weighs in the map: its key and its tools.
    weight: u64,
}

/// What one run weighs, besides its key and its tools.
const RUN_WEIGHT: u64 = 96;
/// What one tool of a run weighs, besides its name (the name's `Arc` is shared with
/// nothing else in the worst case).
const TOOL_WEIGHT: u64 = 40;

impl Counts {
    /// The counters of `prev` (none for a new run) with `charge`'s tool added at the end,
    /// and the verdict of `charge` on them (counted when admitted).
    fn with_tool(prev: Option<&Counts>, charge: &Charge<'_>) -> (Counts, Verdict) {
        let load = |n: &AtomicU64| AtomicU64::new(n.load(Ordering::Relaxed));
        let mut tools: Vec<(Arc<str>, AtomicU64)> = prev
            .map(|p| {
                p.tools
                    .iter()
                    .map(|(t, n)| (Arc::clone(t), load(n)))
                    .collect()
            })
            .unwrap_or_default();
        let weight = charge.key.len() as u64
            + RUN_WEIGHT
            + tools
                .iter()
                .map(|(t, _)| t.len() as u64)
                .chain(std::iter::once(charge.tool.len() as u64))
                .map(|len| len + TOOL_WEIGHT)
                .sum::<u64>();
        let mut counts = Counts {
            calls: prev.map_or_else(|| AtomicU64::new(0), |p| load(&p.calls)),
            cost: prev.map_or_else(|| AtomicU64::new(0), |p| load(&p.cost)),
            tools: Box::default(),
            weight,
        };
        let slot = AtomicU64::new(0);
        let verdict = counts.try_charge(charge, &slot);
        tools.push((Arc::from(charge.tool), slot));
        counts.tools = tools.into_boxed_slice();
        (counts, verdict)
    }

    fn tool(&self, tool: &str) -> Option<&AtomicU64> {
        self.tools
            .iter()
            .find(|(t, _)| **t == *tool)
            .map(|(_, n)| n)
    }

    /// Checks `c` against the limits and counts it on `tool` (one of this run's) when
    /// every one has room. Only under the shard's write lock.
    fn try_charge(&self, c: &Charge<'_>, tool: &AtomicU64) -> Verdict {
        let used = tool.load(Ordering::Relaxed);
        if c.max_calls.is_some_and(|max| used >= max) {
            return Verdict::Exhausted(Limit::ToolCalls);
        }
        let calls = self.calls.load(Ordering::Relaxed);
        if c.run_max_calls.is_some_and(|max| calls >= max) {
            return Verdict::Exhausted(Limit::RunCalls);
        }
        let cost = self.cost.load(Ordering::Relaxed);
        if c.run_max_cost
            .is_some_and(|max| cost.saturating_add(c.cost) > max)
        {
            return Verdict::Exhausted(Limit::RunCost);
        }
        tool.store(used.saturating_add(1), Ordering::Relaxed);
        self.calls.store(calls.saturating_add(1), Ordering::Relaxed);
        self.cost
            .store(cost.saturating_add(c.cost), Ordering::Relaxed);
        Verdict::Admitted
    }
}

/// A [`BudgetStore`] in the memory of one process: one entry per run in a bounded
/// [`TtlMap`] (at most `max_runs` runs, CLOCK eviction, expiry after the TTL of each
/// charge).
///
/// Charges are atomic: each is one update under the lock of the run's shard. When more
/// runs are live than the bound allows, the least recently charged ones are evicted, and
/// such a run starts again from zero if it calls again: memory stays bounded whatever run
/// ids callers choose, at the price of forgetting runs beyond the bound (size it above
/// the number of concurrent runs).
///
/// Cheap to clone; clones share the counters.
#[derive(Clone)]
pub struct MemoryBudgetStore {
    runs: TtlMap<Counts>,
}

impl fmt::Debug for MemoryBudgetStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudgetStore")
            .field("runs", &self.runs.len())
            .finish()
    }
}

/// The bytes allowed per run: enough for the longest keys and a few dozen tools.
const BYTES_PER_RUN: u64 = 4096;

impl MemoryBudgetStore {
    /// A store holding the counters of at most `max_runs` runs (at least 1).
    #[must_use]
    pub fn new(max_runs: u64) -> Self {
        let max_runs = max_runs.max(1);
        MemoryBudgetStore {
            runs: TtlMap::new(MemoryBounds::new(
                max_runs,
                max_runs.saturating_mul(BYTES_PER_RUN),
            )),
        }
    }

    /// The runs held, expired ones not yet freed included.
    pub fn runs(&self) -> u64 {
        self.runs.len()
    }

    /// The counters of a run as `(calls, cost)`, if it is live (for tests and tooling).
    pub fn usage(&self, key: &str) -> Option<(u64, u64)> {
        self.runs.get(key, |c, _| {
            (
                c.calls.load(Ordering::Relaxed),
                c.cost.load(Ordering::Relaxed),
            )
        })
    }

    /// The calls `tool` made in a run, if the run is live.
    pub fn tool_calls(&self, key: &str, tool: &str) -> Option<u64> {
        self.runs.get(key, |c, _| {
            c.tool(tool).map_or(0, |n| n.load(Ordering::Relaxed))
        })
    }

    /// [`charge`](BudgetStore::charge) without a future: the store answers at once.
    pub fn charge_now(&self, charge: &Charge<'_>) -> Result<Verdict, StoreError> {
        let max_weight = self.runs.max_weight();
        self.runs.update(charge.key, |found| {
            let live = found.filter(|f| f.live).map(|f| f.value);
            // A live run that called this tool before: counted in place, its TTL
            // refreshed; nothing is allocated.
            if let Some(run) = live {
                if let Some(tool) = run.tool(charge.tool) {
                    let verdict = run.try_charge(charge, tool);
                    let touch = Write::Touch {
                        weight: run.weight,
                        ttl: charge.ttl,
                        linger: Duration::ZERO,
                    };
                    return (touch, Ok(verdict));
                }
            }
            // A new run, or a tool new to the run: its counters with the tool added.
            let (next, verdict) = Counts::with_tool(live, charge);
            if next.weight > max_weight {
                // Nothing counted, nothing written: the run keeps what it had.
                return (
                    Write::Keep,
                    Err(StoreError::new(
                        "run counters too large for the memory bound",
                    )),
                );
            }
            let put = Write::Put {
                weight: next.weight,
                value: next,
                ttl: charge.ttl,
                linger: Duration::ZERO,
            };
            (put, Ok(verdict))
        })
    }
}

impl BudgetStore for MemoryBudgetStore {
    fn charge<'a>(&'a self, charge: Charge<'a>) -> StoreFuture<'a, Verdict> {
        let result = self.charge_now(&charge);
        Box::pin(std::future::ready(result))
    }
}
