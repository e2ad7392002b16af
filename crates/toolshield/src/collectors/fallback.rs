//! [`FallbackMetrics`]: hand-overs of a fallback chain, read from its
//! [`FallbackStats`] at scrape time.

use std::sync::Arc;

use toolshield_fallback::FallbackStats;
use toolshield_metrics::metrics::{self, Key, Label};

use toolshield_metrics::Collect;
use toolshield_metrics::MetricsTarget;

/// `tool_fallback_handovers_total{tool,tier}`: calls handed to each fallback tier.
pub const TOOL_FALLBACK_HANDOVERS_TOTAL: &str = "tool_fallback_handovers_total";
/// `tool_fallback_exhausted_total{tool}`: calls where every tier failed.
pub const TOOL_FALLBACK_EXHAUSTED_TOTAL: &str = "tool_fallback_exhausted_total";

/// Exports the hand-over counters of one tool's fallback chain. The `tier` label takes the
/// tier names the application configured, so it stays bounded.
///
/// Register it with [`PrometheusExporter::add_collector`](toolshield_metrics::PrometheusExporter::add_collector);
/// the values are copied from the chain's counters each time it is scraped.
#[derive(Debug, Clone)]
pub struct FallbackMetrics {
    tool: Arc<str>,
    stats: Arc<FallbackStats>,
    target: MetricsTarget,
}

impl FallbackMetrics {
    /// Metrics of `tool`'s chain (`FallbackLayer::stats`), registered with `target`.
    pub fn new(
        tool: impl Into<Arc<str>>,
        stats: Arc<FallbackStats>,
        target: MetricsTarget,
    ) -> Self {
        target.describe_counter(
            TOOL_FALLBACK_HANDOVERS_TOTAL,
            Some(metrics::Unit::Count),
            "Calls handed to a fallback tier, by tool and tier.",
        );
        target.describe_counter(
            TOOL_FALLBACK_EXHAUSTED_TOTAL,
            Some(metrics::Unit::Count),
            "Calls where the primary and every fallback tier failed.",
        );
        FallbackMetrics {
            tool: tool.into(),
            stats,
            target,
        }
    }
}

impl Collect for FallbackMetrics {
    fn collect(&self) {
        for (tier, count) in self.stats.hand_overs() {
            let k = Key::from_parts(
                TOOL_FALLBACK_HANDOVERS_TOTAL,
                vec![
                    Label::new("tool", self.tool.to_string()),
                    Label::new("tier", tier.to_string()),
                ],
            );
            self.target.counter(&k).absolute(count);
        }
        let k = Key::from_parts(
            TOOL_FALLBACK_EXHAUSTED_TOTAL,
            vec![Label::new("tool", self.tool.to_string())],
        );
        self.target.counter(&k).absolute(self.stats.exhausted());
    }
}
