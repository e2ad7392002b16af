//! [`BulkheadMetrics`]: the counters of one tool's bulkhead, read from its
//! [`BulkheadStats`] at scrape time.

use std::sync::Arc;

use toolshield_bulkhead::BulkheadStats;
use toolshield_metrics::metrics::{self, Key, Label};

use toolshield_metrics::Collect;
use toolshield_metrics::MetricsTarget;

/// `tool_bulkhead_admitted_total{tool}`: calls given a slot.
pub const TOOL_BULKHEAD_ADMITTED_TOTAL: &str = "tool_bulkhead_admitted_total";
/// `tool_bulkhead_rejected_total{tool}`: calls rejected with `OVERLOADED`.
pub const TOOL_BULKHEAD_REJECTED_TOTAL: &str = "tool_bulkhead_rejected_total";
/// `tool_bulkhead_in_flight{tool}` (gauge): calls holding a slot.
pub const TOOL_BULKHEAD_IN_FLIGHT: &str = "tool_bulkhead_in_flight";
/// `tool_bulkhead_queued{tool}` (gauge): calls waiting for a slot.
pub const TOOL_BULKHEAD_QUEUED: &str = "tool_bulkhead_queued";

/// Exports the counters of one tool's bulkhead. The only label is the tool name the
/// application configured (never a caller id or another key of a keyed bulkhead: the
/// values are the sums over its keys), so the series stay bounded.
///
/// Register it with [`PrometheusExporter::add_collector`](toolshield_metrics::PrometheusExporter::add_collector);
/// the values are copied from the layer's counters each time it is scraped, and the
/// call path carries no metrics code.
#[derive(Debug, Clone)]
pub struct BulkheadMetrics {
    tool: Arc<str>,
    stats: BulkheadStats,
    target: MetricsTarget,
}

impl BulkheadMetrics {
    /// Metrics of `tool`'s bulkhead (`BulkheadLayer::stats`), registered with `target`.
    pub fn new(tool: impl Into<Arc<str>>, stats: BulkheadStats, target: MetricsTarget) -> Self {
        target.describe_counter(
            TOOL_BULKHEAD_ADMITTED_TOTAL,
            Some(metrics::Unit::Count),
            "Calls given a bulkhead slot, at once or after waiting, by tool.",
        );
        target.describe_counter(
            TOOL_BULKHEAD_REJECTED_TOTAL,
            Some(metrics::Unit::Count),
            "Calls rejected by a full bulkhead (OVERLOADED), by tool.",
        );
        BulkheadMetrics {
            tool: tool.into(),
            stats,
            target,
        }
    }

    fn key(&self, name: &'static str) -> Key {
        Key::from_parts(name, vec![Label::new("tool", self.tool.to_string())])
    }
}

impl Collect for BulkheadMetrics {
    fn collect(&self) {
        let s = self.stats.snapshot();
        self.target
            .counter(&self.key(TOOL_BULKHEAD_ADMITTED_TOTAL))
            .absolute(s.admitted);
        self.target
            .counter(&self.key(TOOL_BULKHEAD_REJECTED_TOTAL))
            .absolute(s.rejected);
        self.target
            .gauge(&self.key(TOOL_BULKHEAD_IN_FLIGHT))
            .set(s.in_flight as f64);
        self.target
            .gauge(&self.key(TOOL_BULKHEAD_QUEUED))
            .set(s.queued as f64);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolshield_bulkhead::BulkheadLayer;
    use toolshield_core::{ToolError, ToolRequest, ToolResponse};
    use tower::{service_fn, Layer, ServiceExt};

    use super::*;

    #[tokio::test]
    async fn exports_the_counters_by_tool_only() {
        let exporter = toolshield_metrics::local_prometheus();
        let layer = BulkheadLayer::new(1);
        exporter.add_collector(BulkheadMetrics::new(
            "search",
            layer.stats(),
            exporter.target(),
        ));
        let svc = layer.layer(service_fn(|_r: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!(true)))
        }));
        for caller in ["alice", "bob"] {
            let r = ToolRequest::new("search", json!({})).caller(caller);
            assert!(svc.clone().oneshot(r).await.is_ok());
        }
        let text = exporter.render();
        assert!(
            text.contains(r#"tool_bulkhead_admitted_total{tool="search"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tool_bulkhead_rejected_total{tool="search"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tool_bulkhead_in_flight{tool="search"} 0"#),
            "{text}"
        );
        assert!(!text.contains("alice") && !text.contains("bob"), "{text}");
    }
}
