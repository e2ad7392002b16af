//! [`BudgetLedger`]: the counters every tool's budget layer shares.

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use toolshield_contract::config::MAX_DURATION;
use toolshield_contract::{ConfigError, ErrorKind, ShieldRequest, ToolError};
use toolshield_store::StoreError;

use crate::config::{LedgerConfig, OnStoreError, Scope, WithoutRun, MAX_ID_LEN, MAX_LIMIT};
use crate::store::{BudgetKey, BudgetStore, Charge, Limit, MemoryBudgetStore, Verdict};

/// Where the ledger's counters live.
#[derive(Debug)]
enum Backend {
    /// Charged synchronously in `call`: no future, no allocation.
    Memory(MemoryBudgetStore),
    Store(Arc<dyn BudgetStore>),
}

/// What one tool's layers counted, read by metrics at scrape time.
#[derive(Debug)]
pub struct ToolStats {
    tool: Arc<str>,
    admitted: AtomicU64,
    exhausted: [AtomicU64; 3],
    without_run: AtomicU64,
    rejected_without_run: AtomicU64,
    store_errors: AtomicU64,
}

impl ToolStats {
    fn new(tool: Arc<str>) -> Self {
        ToolStats {
            tool,
            admitted: AtomicU64::new(0),
            exhausted: Default::default(),
            without_run: AtomicU64::new(0),
            rejected_without_run: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
        }
    }

    /// The tool's name.
    pub fn tool(&self) -> &Arc<str> {
        &self.tool
    }

    /// Calls counted against a budget and let through.
    pub fn admitted(&self) -> u64 {
        self.admitted.load(Ordering::Relaxed)
    }

    /// Calls rejected with `BUDGET_EXHAUSTED` by `limit`.
    pub fn exhausted(&self, limit: Limit) -> u64 {
        self.exhausted[limit as usize].load(Ordering::Relaxed)
    }

    /// Calls without the id their scope needs, let through unlimited.
    pub fn without_run(&self) -> u64 {
        self.without_run.load(Ordering::Relaxed)
    }

    /// Calls without the id their scope needs, rejected (or with an id too long).
    pub fn rejected_without_run(&self) -> u64 {
        self.rejected_without_run.load(Ordering::Relaxed)
    }

    /// Charges the store failed (each then allowed or rejected, as configured).
    pub fn store_errors(&self) -> u64 {
        self.store_errors.load(Ordering::Relaxed)
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

struct Shared {
    backend: Backend,
    scope: Scope,
    run_max_calls: Option<u64>,
    run_max_cost: Option<u64>,
    run_ttl: Duration,
    without_run: WithoutRun,
    on_store_error: OnStoreError,
    /// One entry per tool name a layer was built for (names come from configuration).
    tools: Mutex<Vec<Arc<ToolStats>>>,
}

/// The counters of runs, shared by the budget layers of every tool: clone it into each
/// tool's [`BudgetLayer`](crate::BudgetLayer), so a run's total calls and cost are
/// counted across tools.
///
/// It holds the run-wide limits (`run_max_calls`, `run_max_cost`), the [`Scope`] (whose
/// calls one budget counts), the TTL of a run's counters, the store (in memory, or a
/// [`BudgetStore`] such as Redis shared by replicas), and what to do without a run id or
/// when the store fails. Each tool's layer adds its own `max_calls` and `cost`.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct BudgetLedger {
    shared: Arc<Shared>,
}

impl fmt::Debug for BudgetLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("BudgetLedger")
            .field("backend", &s.backend)
            .field("scope", &s.scope)
            .field("run_max_calls", &s.run_max_calls)
            .field("run_max_cost", &s.run_max_cost)
            .field("run_ttl", &s.run_ttl)
            .finish_non_exhaustive()
    }
}

/// What the layer does with one call.
pub(crate) enum Admission {
    /// Let it through (counted, or not limited).
    Pass,
    /// Answer with this error.
    Reject(ToolError),
    /// Ask the store first (owned key: the store path outlives the call).
    Store(String),
}

thread_local! {
    /// The encoded key of the call being charged in memory: reused, so a charge of a known
    /// run allocates nothing.
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

impl BudgetLedger {
    /// An in-memory ledger with the limits of `cfg`, holding at most `cfg.max_runs` runs.
    pub fn from_config(cfg: &LedgerConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::build(
            cfg,
            Backend::Memory(MemoryBudgetStore::new(cfg.max_runs)),
        ))
    }

    /// A ledger with the limits of `cfg` whose counters live in `store` (`max_runs` is
    /// the store's business).
    pub fn with_store(
        cfg: &LedgerConfig,
        store: Arc<dyn BudgetStore>,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::build(cfg, Backend::Store(store)))
    }

    /// An in-memory ledger with no run-wide limit (only the tools' `max_calls`), the
    /// `run` scope and the other defaults of [`LedgerConfig`].
    #[must_use]
    pub fn new() -> Self {
        let cfg = LedgerConfig::default();
        Self::build(&cfg, Backend::Memory(MemoryBudgetStore::new(cfg.max_runs)))
    }

    /// Whether the ledger limits runs across tools (`run_max_calls` or `run_max_cost`):
    /// then every tool's calls count, even a tool with no limit of its own.
    pub fn has_run_limits(&self) -> bool {
        self.shared.run_max_calls.is_some() || self.shared.run_max_cost.is_some()
    }

    /// Limits every run to `max` calls across tools (clamped to [`MAX_LIMIT`]).
    ///
    /// The builder steps configure a ledger before layers are built from it: each returns
    /// a new ledger on the same store.
    #[must_use]
    pub fn run_max_calls(self, max: u64) -> Self {
        self.rebuild(|s| s.run_max_calls = Some(max.min(MAX_LIMIT)))
    }

    /// Limits every run to `max` cost units across tools (clamped to [`MAX_LIMIT`]).
    #[must_use]
    pub fn run_max_cost(self, max: u64) -> Self {
        self.rebuild(|s| s.run_max_cost = Some(max.min(MAX_LIMIT)))
    }

    /// Counts budgets per `scope`.
    #[must_use]
    pub fn scope(self, scope: Scope) -> Self {
        self.rebuild(|s| s.scope = scope)
    }

    /// How long a run's counters live after its last call (at least 1 ms, at most
    /// [`MAX_DURATION`]).
    #[must_use]
    pub fn run_ttl(self, ttl: Duration) -> Self {
        self.rebuild(|s| s.run_ttl = ttl.clamp(Duration::from_millis(1), MAX_DURATION))
    }

    /// What happens to a call without the id its scope needs.
    #[must_use]
    pub fn without_run(self, without_run: WithoutRun) -> Self {
        self.rebuild(|s| s.without_run = without_run)
    }

    /// What happens to a call when the store fails.
    #[must_use]
    pub fn on_store_error(self, on_store_error: OnStoreError) -> Self {
        self.rebuild(|s| s.on_store_error = on_store_error)
    }

    fn build(cfg: &LedgerConfig, backend: Backend) -> Self {
        BudgetLedger {
            shared: Arc::new(Shared {
                backend,
                scope: cfg.scope,
                run_max_calls: cfg.run_max_calls,
                run_max_cost: cfg.run_max_cost,
                run_ttl: cfg.run_ttl,
                without_run: cfg.without_run,
                on_store_error: cfg.on_store_error,
                tools: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A builder step: the same store (its counters are kept), new settings.
    fn rebuild(self, f: impl FnOnce(&mut LedgerConfig)) -> Self {
        let s = &self.shared;
        let mut cfg = LedgerConfig {
            scope: s.scope,
            run_max_calls: s.run_max_calls,
            run_max_cost: s.run_max_cost,
            run_ttl: s.run_ttl,
            max_runs: 1,
            without_run: s.without_run,
            on_store_error: s.on_store_error,
        };
        f(&mut cfg);
        let backend = match &s.backend {
            Backend::Memory(m) => Backend::Memory(m.clone()),
            Backend::Store(st) => Backend::Store(Arc::clone(st)),
        };
        Self::build(&cfg, backend)
    }

    /// The in-memory store, when the ledger keeps its counters in memory.
    pub fn memory_store(&self) -> Option<&MemoryBudgetStore> {
        match &self.shared.backend {
            Backend::Memory(m) => Some(m),
            Backend::Store(_) => None,
        }
    }

    /// The scope of the budgets.
    pub fn scope_of(&self) -> Scope {
        self.shared.scope
    }

    /// The counts of every tool a layer was built for, in the order they were first built.
    pub fn stats(&self) -> Vec<Arc<ToolStats>> {
        self.shared
            .tools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The stats of `tool`, created on first use.
    pub(crate) fn register(&self, tool: &Arc<str>) -> Arc<ToolStats> {
        let mut tools = self.shared.tools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = tools.iter().find(|t| t.tool == *tool) {
            return Arc::clone(t);
        }
        let stats = Arc::new(ToolStats::new(Arc::clone(tool)));
        tools.push(Arc::clone(&stats));
        stats
    }

    fn charge<'a>(&self, key: &'a str, tool: &'a ToolBudget) -> Charge<'a> {
        let s = &self.shared;
        Charge {
            key,
            tool: &tool.name,
            max_calls: tool.max_calls,
            cost: tool.cost,
            run_max_calls: s.run_max_calls,
            run_max_cost: s.run_max_cost,
            ttl: s.run_ttl,
        }
    }

    /// Decides what the layer does with `req`, charging the in-memory store at once.
    pub(crate) fn admit<Req: ShieldRequest>(&self, tool: &ToolBudget, req: &Req) -> Admission {
        let s = &self.shared;
        let meta = req.call_meta();
        let Some(key) = BudgetKey::new(s.scope, meta.run_id, meta.caller) else {
            return match s.without_run {
                WithoutRun::Allow => {
                    ToolStats::bump(&tool.stats.without_run);
                    Admission::Pass
                }
                WithoutRun::Reject => {
                    ToolStats::bump(&tool.stats.rejected_without_run);
                    let what = match s.scope {
                        Scope::Caller => "caller id",
                        Scope::Run | Scope::RunAndCaller => "run id",
                    };
                    Admission::Reject(ToolError::new(
                        ErrorKind::InvalidInput,
                        format!(
                            "call has no {what}; the call budget of tool `{}` requires one",
                            tool.name
                        ),
                    ))
                }
            };
        };
        if key.longest_id() > MAX_ID_LEN {
            ToolStats::bump(&tool.stats.rejected_without_run);
            return Admission::Reject(ToolError::new(
                ErrorKind::InvalidInput,
                format!("run or caller id is longer than {MAX_ID_LEN} bytes"),
            ));
        }
        match &s.backend {
            Backend::Memory(store) => {
                let verdict = KEY.with_borrow_mut(|buf| {
                    buf.clear();
                    key.encode(buf);
                    let verdict = store.charge_now(&self.charge(buf, tool));
                    if buf.capacity() > 4 * MAX_ID_LEN {
                        // Keep no outsized buffer per thread.
                        *buf = String::new();
                    }
                    verdict
                });
                self.settle(tool, verdict)
            }
            Backend::Store(_) => Admission::Store(key.encoded()),
        }
    }

    /// Charges the external store for the call of `key` (the store path).
    pub(crate) async fn admit_in_store(
        &self,
        tool: &ToolBudget,
        key: &str,
    ) -> Result<(), ToolError> {
        let Backend::Store(store) = &self.shared.backend else {
            return Ok(());
        };
        let verdict = store.charge(self.charge(key, tool)).await;
        match self.settle(tool, verdict) {
            Admission::Reject(e) => Err(e),
            Admission::Pass | Admission::Store(_) => Ok(()),
        }
    }

    fn settle(&self, tool: &ToolBudget, verdict: Result<Verdict, StoreError>) -> Admission {
        match verdict {
            Ok(Verdict::Admitted) => {
                ToolStats::bump(&tool.stats.admitted);
                Admission::Pass
            }
            Ok(Verdict::Exhausted(limit)) => {
                ToolStats::bump(&tool.stats.exhausted[limit as usize]);
                Admission::Reject(self.exhausted(tool, limit))
            }
            Err(e) => {
                ToolStats::bump(&tool.stats.store_errors);
                match self.shared.on_store_error {
                    OnStoreError::Reject => Admission::Reject(
                        ToolError::new(
                            ErrorKind::StoreUnavailable,
                            format!("call budget of tool `{}` could not be checked", tool.name),
                        )
                        .with_source(e),
                    ),
                    OnStoreError::Allow => {
                        tracing::warn!(
                            target: "toolshield::budget",
                            tool = %tool.name,
                            error = %e,
                            "budget store failed; call allowed uncounted"
                        );
                        Admission::Pass
                    }
                }
            }
        }
    }

    /// The error of a call rejected by `limit`: names the limit, never the run or caller.
    fn exhausted(&self, tool: &ToolBudget, limit: Limit) -> ToolError {
        let s = &self.shared;
        let message = match limit {
            Limit::ToolCalls => format!(
                "call budget exhausted: tool `{}` has used its {} calls in this run",
                tool.name,
                tool.max_calls.unwrap_or(0)
            ),
            Limit::RunCalls => format!(
                "call budget exhausted: this run has used its {} calls across tools",
                s.run_max_calls.unwrap_or(0)
            ),
            Limit::RunCost => format!(
                "call budget exhausted: a call of tool `{}` costs {}, and this run has no room left in its {} cost units",
                tool.name,
                tool.cost,
                s.run_max_cost.unwrap_or(0)
            ),
        };
        ToolError::new(ErrorKind::BudgetExhausted, message)
    }
}

impl Default for BudgetLedger {
    fn default() -> Self {
        Self::new()
    }
}

/// One tool's budget within a ledger: what its layer holds.
#[derive(Debug)]
pub(crate) struct ToolBudget {
    pub(crate) name: Arc<str>,
    pub(crate) max_calls: Option<u64>,
    pub(crate) cost: u64,
    pub(crate) stats: Arc<ToolStats>,
}
