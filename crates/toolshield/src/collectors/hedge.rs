//! [`HedgeMetrics`]: hedges of one tool, read from its [`HedgeStats`] at scrape time.

use std::sync::Arc;

use toolshield_hedge::HedgeStats;
use toolshield_metrics::metrics::{self, Key, Label};

use toolshield_metrics::Collect;
use toolshield_metrics::MetricsTarget;

/// `tool_hedges_total{tool}`: extra attempts sent by hedging.
pub const TOOL_HEDGES_TOTAL: &str = "tool_hedges_total";
/// `tool_hedge_wins_total{tool}`: calls answered by a hedge rather than the first attempt.
pub const TOOL_HEDGE_WINS_TOTAL: &str = "tool_hedge_wins_total";
/// `tool_hedges_denied_total{tool}`: hedges the retry budget refused.
pub const TOOL_HEDGES_DENIED_TOTAL: &str = "tool_hedges_denied_total";

/// Exports the hedge counters of one tool's hedging layer (`HedgeLayer::stats`).
///
/// Register it with [`PrometheusExporter::add_collector`](toolshield_metrics::PrometheusExporter::add_collector);
/// the values are copied from the layer's counters each time it is scraped.
#[derive(Debug, Clone)]
pub struct HedgeMetrics {
    tool: Arc<str>,
    stats: Arc<HedgeStats>,
    target: MetricsTarget,
}

impl HedgeMetrics {
    /// Metrics of `tool`'s hedging layer, registered with `target`.
    pub fn new(tool: impl Into<Arc<str>>, stats: Arc<HedgeStats>, target: MetricsTarget) -> Self {
        for (name, help) in [
            (
                TOOL_HEDGES_TOTAL,
                "Extra attempts sent by hedging, by tool.",
            ),
            (
                TOOL_HEDGE_WINS_TOTAL,
                "Calls answered by a hedge rather than the first attempt, by tool.",
            ),
            (
                TOOL_HEDGES_DENIED_TOTAL,
                "Hedges not sent because the retry budget refused them, by tool.",
            ),
        ] {
            target.describe_counter(name, Some(metrics::Unit::Count), help);
        }
        HedgeMetrics {
            tool: tool.into(),
            stats,
            target,
        }
    }
}

impl Collect for HedgeMetrics {
    fn collect(&self) {
        for (name, value) in [
            (TOOL_HEDGES_TOTAL, self.stats.hedges_sent()),
            (TOOL_HEDGE_WINS_TOTAL, self.stats.hedge_wins()),
            (TOOL_HEDGES_DENIED_TOTAL, self.stats.budget_denied()),
        ] {
            let k = Key::from_parts(name, vec![Label::new("tool", self.tool.to_string())]);
            self.target.counter(&k).absolute(value);
        }
    }
}
