//! [`BudgetMetrics`]: what the budget layers of a ledger counted, read from its
//! [`ToolStats`] at scrape time, with bounded labels (tool name and limit, never a run or
//! caller id).

use std::sync::Arc;

use toolshield_budget::{BudgetLedger, Limit, ToolStats};
use toolshield_metrics::metrics::{self, Key, Label};
use toolshield_metrics::names::OTHER_TOOL;
use toolshield_metrics::Collect;
use toolshield_metrics::MetricsTarget;
use toolshield_metrics::MAX_TOOLS;

/// `tool_budget_admitted_total{tool}`: calls counted against a run's budget and let through.
pub const TOOL_BUDGET_ADMITTED_TOTAL: &str = "tool_budget_admitted_total";
/// `tool_budget_exhausted_total{tool,limit}`: calls rejected with `BUDGET_EXHAUSTED`, by
/// the limit that had no room (`tool_calls`, `run_calls`, `run_cost`).
pub const TOOL_BUDGET_EXHAUSTED_TOTAL: &str = "tool_budget_exhausted_total";
/// `tool_budget_without_run_total{tool,action}`: calls without the id their scope needs,
/// `allowed` (not limited) or `rejected` (and calls whose id was too long).
pub const TOOL_BUDGET_WITHOUT_RUN_TOTAL: &str = "tool_budget_without_run_total";
/// `tool_budget_store_errors_total{tool}`: charges the budget store failed.
pub const TOOL_BUDGET_STORE_ERRORS_TOTAL: &str = "tool_budget_store_errors_total";
/// `tool_budget_runs`: runs held by an in-memory ledger (bounded by `max_runs`).
pub const TOOL_BUDGET_RUNS: &str = "tool_budget_runs";

/// The counts of one tool (or of `other`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    admitted: u64,
    exhausted: [u64; 3],
    allowed_without_run: u64,
    rejected_without_run: u64,
    store_errors: u64,
}

impl Counts {
    fn of(stats: &ToolStats) -> Self {
        Counts {
            admitted: stats.admitted(),
            exhausted: Limit::ALL.map(|l| stats.exhausted(l)),
            allowed_without_run: stats.without_run(),
            rejected_without_run: stats.rejected_without_run(),
            store_errors: stats.store_errors(),
        }
    }

    fn add(&mut self, o: &Counts) {
        self.admitted = self.admitted.saturating_add(o.admitted);
        for (a, b) in self.exhausted.iter_mut().zip(o.exhausted) {
            *a = a.saturating_add(b);
        }
        self.allowed_without_run = self
            .allowed_without_run
            .saturating_add(o.allowed_without_run);
        self.rejected_without_run = self
            .rejected_without_run
            .saturating_add(o.rejected_without_run);
        self.store_errors = self.store_errors.saturating_add(o.store_errors);
    }
}

/// Exports the budget counters of every tool a [`BudgetLedger`]'s layers were built for:
/// `tool_budget_admitted_total{tool}`, `tool_budget_exhausted_total{tool,limit}`,
/// `tool_budget_without_run_total{tool,action}`, `tool_budget_store_errors_total{tool}`,
/// and `tool_budget_runs` for an in-memory ledger.
///
/// The values are copied from the ledger's counters each time it is scraped; the layers'
/// hot path carries no metrics code. **Labels are bounded**: `tool` takes the names the
/// application built layers for (the first [`MAX_TOOLS`]; any further ones are summed
/// under `other`), `limit` and `action` take fixed values, and no run or caller id ever
/// becomes a label. Register it with
/// [`PrometheusExporter::add_collector`](toolshield_metrics::PrometheusExporter::add_collector).
#[derive(Debug, Clone)]
pub struct BudgetMetrics {
    ledger: BudgetLedger,
    target: MetricsTarget,
}

impl BudgetMetrics {
    /// Metrics of the layers built from `ledger`, registered with `target`.
    pub fn new(ledger: BudgetLedger, target: MetricsTarget) -> Self {
        target.describe_counter(
            TOOL_BUDGET_ADMITTED_TOTAL,
            Some(metrics::Unit::Count),
            "Calls counted against an agent run's budget and let through.",
        );
        target.describe_counter(
            TOOL_BUDGET_EXHAUSTED_TOTAL,
            Some(metrics::Unit::Count),
            "Calls rejected with BUDGET_EXHAUSTED, by the limit that had no room.",
        );
        target.describe_counter(
            TOOL_BUDGET_WITHOUT_RUN_TOTAL,
            Some(metrics::Unit::Count),
            "Calls without the run (or caller) id their budget scope needs.",
        );
        target.describe_counter(
            TOOL_BUDGET_STORE_ERRORS_TOTAL,
            Some(metrics::Unit::Count),
            "Budget charges the store failed.",
        );
        BudgetMetrics { ledger, target }
    }

    fn export(&self, tool: &Arc<str>, c: &Counts) {
        let tool_label = || Label::new("tool", tool.to_string());
        let counter = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = vec![tool_label()];
            if let Some((k, v)) = extra {
                labels.push(Label::new(k, v));
            }
            self.target.counter(&Key::from_parts(name, labels))
        };
        counter(TOOL_BUDGET_ADMITTED_TOTAL, None).absolute(c.admitted);
        for (limit, n) in Limit::ALL.into_iter().zip(c.exhausted) {
            counter(TOOL_BUDGET_EXHAUSTED_TOTAL, Some(("limit", limit.as_str()))).absolute(n);
        }
        counter(TOOL_BUDGET_WITHOUT_RUN_TOTAL, Some(("action", "allowed")))
            .absolute(c.allowed_without_run);
        counter(TOOL_BUDGET_WITHOUT_RUN_TOTAL, Some(("action", "rejected")))
            .absolute(c.rejected_without_run);
        counter(TOOL_BUDGET_STORE_ERRORS_TOTAL, None).absolute(c.store_errors);
    }
}

impl Collect for BudgetMetrics {
    fn collect(&self) {
        let stats = self.ledger.stats();
        let mut other: Option<Counts> = None;
        for (i, s) in stats.iter().enumerate() {
            let counts = Counts::of(s);
            // `other` is a reserved label value: a tool of that name is folded into it.
            if i < MAX_TOOLS && &**s.tool() != OTHER_TOOL {
                self.export(s.tool(), &counts);
            } else {
                other.get_or_insert_with(Counts::default).add(&counts);
            }
        }
        if let Some(other) = other {
            self.export(&Arc::from(OTHER_TOOL), &other);
        }
        if let Some(store) = self.ledger.memory_store() {
            let runs = Key::from_name(TOOL_BUDGET_RUNS);
            self.target.gauge(&runs).set(store.runs() as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolshield_budget::BudgetLayer;
    use toolshield_core::ToolRequest;
    use toolshield_metrics::local_prometheus;
    use toolshield_test::{call_now, BareTool};
    use tower::Layer;

    #[test]
    fn exports_counts_by_tool_and_limit_and_never_a_run_id() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let exporter = local_prometheus();
        let ledger = BudgetLedger::new().run_max_calls(3);
        exporter.add_collector(BudgetMetrics::new(ledger.clone(), exporter.target()));
        let mut search = BudgetLayer::new(&ledger, "search", Some(1)).layer(BareTool);
        let mut fetch = BudgetLayer::new(&ledger, "fetch", None).layer(BareTool);
        let run = |t: &str| ToolRequest::new(t, json!({})).run_id("secret-run-7");
        assert!(call_now(&mut search, run("search")).is_ok());
        assert!(call_now(&mut search, run("search")).is_err());
        assert!(call_now(&mut fetch, run("fetch")).is_ok());
        assert!(call_now(&mut fetch, run("fetch")).is_ok());
        assert!(call_now(&mut fetch, run("fetch")).is_err());
        assert!(call_now(&mut fetch, ToolRequest::new("fetch", json!({}))).is_ok());
        let text = exporter.render();
        assert!(
            text.contains(r#"tool_budget_admitted_total{tool="search"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tool_budget_admitted_total{tool="fetch"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tool_budget_exhausted_total{tool="search",limit="tool_calls"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tool_budget_exhausted_total{tool="fetch",limit="run_calls"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tool_budget_without_run_total{tool="fetch",action="allowed"} 1"#),
            "{text}"
        );
        assert!(text.contains("tool_budget_runs 1"), "{text}");
        assert!(!text.contains("secret-run-7"), "{text}");
    }

    #[test]
    fn tools_beyond_the_bound_are_folded_into_other() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let exporter = local_prometheus();
        let ledger = BudgetLedger::new();
        exporter.add_collector(BudgetMetrics::new(ledger.clone(), exporter.target()));
        for i in 0..MAX_TOOLS + 5 {
            let name = format!("tool-{i}");
            let mut svc = BudgetLayer::new(&ledger, name.as_str(), None).layer(BareTool);
            assert!(call_now(&mut svc, ToolRequest::new(name, json!({})).run_id("r")).is_ok());
        }
        let text = exporter.render();
        let admitted = text
            .lines()
            .filter(|l| l.starts_with("tool_budget_admitted_total{"))
            .count();
        assert_eq!(admitted, MAX_TOOLS + 1, "MAX_TOOLS names and other");
        assert!(text.contains(r#"tool_budget_admitted_total{tool="other"} 5"#));
    }
}
