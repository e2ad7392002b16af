use std::sync::Arc;

use toolshield_contract::config::Problems;
use toolshield_contract::ConfigError;
use tower_layer::Layer;

use crate::config::{BudgetConfig, MAX_LIMIT};
use crate::ledger::{BudgetLedger, ToolBudget, ToolStats};
use crate::service::Budget;

/// Counts the calls of one tool against the budgets of a [`BudgetLedger`]: the tool's own
/// `max_calls` per run, and the run's totals the ledger holds.
///
/// Configuration only (the tool's name, limit and cost, and the shared ledger); see
/// [`Budget`] for the behaviour.
#[derive(Debug, Clone)]
pub struct BudgetLayer {
    ledger: BudgetLedger,
    tool: Arc<ToolBudget>,
}

impl BudgetLayer {
    /// The budget of `tool` in `ledger`: at most `max_calls` calls per run (`None`: only
    /// the run's totals apply), each costing nothing. `max_calls` is clamped to
    /// [`MAX_LIMIT`].
    #[must_use]
    pub fn new(ledger: &BudgetLedger, tool: impl Into<Arc<str>>, max_calls: Option<u64>) -> Self {
        let name: Arc<str> = tool.into();
        let stats = ledger.register(&name);
        BudgetLayer {
            ledger: ledger.clone(),
            tool: Arc::new(ToolBudget {
                name,
                max_calls: max_calls.map(|m| m.min(MAX_LIMIT)),
                cost: 0,
                stats,
            }),
        }
    }

    /// Each call adds `cost` units to the run's total (checked against the ledger's
    /// `run_max_cost`); clamped to [`MAX_LIMIT`].
    #[must_use]
    pub fn cost(self, cost: u64) -> Self {
        let t = &self.tool;
        BudgetLayer {
            tool: Arc::new(ToolBudget {
                name: Arc::clone(&t.name),
                max_calls: t.max_calls,
                cost: cost.min(MAX_LIMIT),
                stats: Arc::clone(&t.stats),
            }),
            ledger: self.ledger,
        }
    }

    /// The budget of `tool` in `ledger` from a validated config; a blank tool name is an
    /// error too.
    pub fn from_config(
        ledger: &BudgetLedger,
        tool: impl Into<Arc<str>>,
        cfg: &BudgetConfig,
    ) -> Result<Self, ConfigError> {
        let tool: Arc<str> = tool.into();
        let mut p = Problems::new();
        p.check(!tool.trim().is_empty(), "tool", "must not be blank");
        p.extend("", cfg.validate());
        p.into_result()?;
        Ok(BudgetLayer::new(ledger, tool, cfg.max_calls).cost(cfg.cost))
    }

    /// The ledger the layer charges.
    pub fn ledger(&self) -> &BudgetLedger {
        &self.ledger
    }

    /// The tool's counts.
    pub fn stats(&self) -> &Arc<ToolStats> {
        &self.tool.stats
    }
}

impl<S> Layer<S> for BudgetLayer {
    type Service = Budget<S>;

    fn layer(&self, inner: S) -> Budget<S> {
        Budget::new(inner, self.ledger.clone(), Arc::clone(&self.tool))
    }
}
