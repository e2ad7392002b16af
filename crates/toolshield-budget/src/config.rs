//! The configuration: [`LedgerConfig`] for the budget a run shares across tools, and
//! [`BudgetConfig`] for one tool.

use std::time::Duration;

use toolshield_contract::config::Problems;
use toolshield_contract::ConfigError;

/// The largest limit or cost accepted: 2^53 - 1, so every count is exact in a Redis
/// script (Lua numbers are doubles).
pub const MAX_LIMIT: u64 = (1 << 53) - 1;

/// The longest run id or caller id a budget accepts, in bytes. A call with a longer one
/// is rejected with `INVALID_INPUT` (an id is never cut or hashed: two ids must never
/// share a budget).
pub const MAX_ID_LEN: usize = 512;

/// Whose calls a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Scope {
    /// One budget per run id (`run`). The default.
    #[default]
    Run,
    /// One budget per caller id (`caller`), across its runs.
    Caller,
    /// One budget per run id and caller id (`run_and_caller`); a call of the run without
    /// a caller id has a budget of its own.
    RunAndCaller,
}

/// What happens to a call without the id its [`Scope`] needs (a run id; a caller id for
/// `caller`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum WithoutRun {
    /// It is not limited (`allow`): calls outside any agent run keep working. The default.
    #[default]
    Allow,
    /// It fails with `INVALID_INPUT` (`reject`): every call must belong to a run.
    Reject,
}

/// What happens to a call when the budget store fails (a Redis that is down or slow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum OnStoreError {
    /// It fails with `STORE_UNAVAILABLE` (`reject`): a limit is never exceeded. The
    /// default, as the idempotency layer fails closed.
    #[default]
    Reject,
    /// It runs uncounted (`allow`), logged as a warning: an outage of the store does not
    /// stop the agents, and the limits do not hold meanwhile.
    Allow,
}

/// The budget a run shares across tools, and how runs are kept: the configuration of a
/// [`BudgetLedger`](crate::BudgetLedger).
///
/// ```
/// use std::time::Duration;
/// use toolshield_budget::{LedgerConfig, Scope};
///
/// let cfg: LedgerConfig = serde_json::from_str(
///     r#"{"scope": "run_and_caller", "run_max_calls": 50, "run_max_cost": 100, "run_ttl": "30m"}"#,
/// ).unwrap();
/// assert_eq!(cfg.scope, Scope::RunAndCaller);
/// assert_eq!(cfg.run_ttl, Duration::from_secs(1800));
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct LedgerConfig {
    /// Whose calls a budget counts. Default `run`.
    pub scope: Scope,
    /// Calls a run may make across every tool. Default none.
    pub run_max_calls: Option<u64>,
    /// Cost units a run may spend across every tool (each tool's `cost` per call).
    /// Default none.
    pub run_max_cost: Option<u64>,
    /// How long a run's counters live after its last call. Default 1 h.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub run_ttl: Duration,
    /// At most this many runs held by the in-memory store (the least recently charged
    /// are forgotten beyond it). Default 100,000.
    pub max_runs: u64,
    /// A call without the id its scope needs. Default `allow` (not limited).
    pub without_run: WithoutRun,
    /// A call when the store fails. Default `reject` (`STORE_UNAVAILABLE`).
    pub on_store_error: OnStoreError,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            scope: Scope::Run,
            run_max_calls: None,
            run_max_cost: None,
            run_ttl: Duration::from_secs(3600),
            max_runs: 100_000,
            without_run: WithoutRun::Allow,
            on_store_error: OnStoreError::Reject,
        }
    }
}

impl LedgerConfig {
    /// Every problem: limits above [`MAX_LIMIT`], a zero or unbounded `run_ttl`, a
    /// `max_runs` of 0 or above 100,000,000.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        check_limit(&mut p, self.run_max_calls, "run_max_calls");
        check_limit(&mut p, self.run_max_cost, "run_max_cost");
        p.check(!self.run_ttl.is_zero(), "run_ttl", "must be greater than 0");
        p.check_duration(self.run_ttl, "run_ttl");
        p.check(self.max_runs >= 1, "max_runs", "must be at least 1");
        p.check(
            self.max_runs <= 100_000_000,
            "max_runs",
            "must be at most 100000000",
        );
        p.into_result()
    }
}

/// The budget of one tool within a run.
///
/// ```
/// use toolshield_budget::BudgetConfig;
///
/// let cfg: BudgetConfig = serde_json::from_str(r#"{"max_calls": 10, "cost": 5}"#).unwrap();
/// assert_eq!((cfg.max_calls, cfg.cost), (Some(10), 5));
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct BudgetConfig {
    /// Calls of this tool a run may make. Default none (only the run's totals apply);
    /// 0 forbids the tool within runs.
    pub max_calls: Option<u64>,
    /// Cost units each call adds to the run's total (checked against `run_max_cost`).
    /// Default 0.
    pub cost: u64,
}

impl BudgetConfig {
    /// Every problem: a limit or cost above [`MAX_LIMIT`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        check_limit(&mut p, self.max_calls, "max_calls");
        check_limit(&mut p, Some(self.cost), "cost");
        p.into_result()
    }
}

fn check_limit(p: &mut Problems, value: Option<u64>, field: &str) {
    if let Some(v) = value {
        p.check(
            v <= MAX_LIMIT,
            field,
            format_args!("{v} is above the largest accepted ({MAX_LIMIT})"),
        );
    }
}
