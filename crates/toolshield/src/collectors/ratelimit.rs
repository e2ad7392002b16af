//! [`RateLimitMetrics`]: the counters of one tool's rate limiter, read from its
//! [`RateLimitStats`] at scrape time.

use std::sync::Arc;

use toolshield_metrics::metrics::{self, Key, Label};
use toolshield_ratelimit::RateLimitStats;

use toolshield_metrics::Collect;
use toolshield_metrics::MetricsTarget;

/// `tool_rate_limit_admitted_total{tool}`: calls let through.
pub const TOOL_RATE_LIMIT_ADMITTED_TOTAL: &str = "tool_rate_limit_admitted_total";
/// `tool_rate_limit_waited_total{tool}`: calls that waited for their turn.
pub const TOOL_RATE_LIMIT_WAITED_TOTAL: &str = "tool_rate_limit_waited_total";
/// `tool_rate_limit_rejected_total{tool}`: calls rejected with `RATE_LIMITED`.
pub const TOOL_RATE_LIMIT_REJECTED_TOTAL: &str = "tool_rate_limit_rejected_total";
/// `tool_rate_limit_store_errors_total{tool}`: failures of the limiter's store.
pub const TOOL_RATE_LIMIT_STORE_ERRORS_TOTAL: &str = "tool_rate_limit_store_errors_total";

/// Exports the counters of one tool's rate limiter. The only label is the tool name the
/// application configured (never a caller or run id the limiter keys on: the values are
/// the sums over its keys), so the series stay bounded.
///
/// Register it with [`PrometheusExporter::add_collector`](toolshield_metrics::PrometheusExporter::add_collector);
/// the values are copied from the layer's counters each time it is scraped.
#[derive(Debug, Clone)]
pub struct RateLimitMetrics {
    tool: Arc<str>,
    stats: RateLimitStats,
    target: MetricsTarget,
}

impl RateLimitMetrics {
    /// Metrics of `tool`'s limiter (`RateLimitLayer::stats`), registered with `target`.
    pub fn new(tool: impl Into<Arc<str>>, stats: RateLimitStats, target: MetricsTarget) -> Self {
        for (name, help) in [
            (
                TOOL_RATE_LIMIT_ADMITTED_TOTAL,
                "Calls let through by the rate limiter, by tool.",
            ),
            (
                TOOL_RATE_LIMIT_WAITED_TOTAL,
                "Calls that waited for their turn under the rate limit, by tool.",
            ),
            (
                TOOL_RATE_LIMIT_REJECTED_TOTAL,
                "Calls rejected by the rate limiter (RATE_LIMITED), by tool.",
            ),
            (
                TOOL_RATE_LIMIT_STORE_ERRORS_TOTAL,
                "Failures of the rate limiter's store (handled by on_store_error), by tool.",
            ),
        ] {
            target.describe_counter(name, Some(metrics::Unit::Count), help);
        }
        RateLimitMetrics {
            tool: tool.into(),
            stats,
            target,
        }
    }
}

impl Collect for RateLimitMetrics {
    fn collect(&self) {
        let s = self.stats.snapshot();
        for (name, value) in [
            (TOOL_RATE_LIMIT_ADMITTED_TOTAL, s.admitted),
            (TOOL_RATE_LIMIT_WAITED_TOTAL, s.waited),
            (TOOL_RATE_LIMIT_REJECTED_TOTAL, s.rejected),
            (TOOL_RATE_LIMIT_STORE_ERRORS_TOTAL, s.store_errors),
        ] {
            let k = Key::from_parts(name, vec![Label::new("tool", self.tool.to_string())]);
            self.target.counter(&k).absolute(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use toolshield_core::{ToolError, ToolRequest, ToolResponse};
    use toolshield_ratelimit::{ByCaller, RateLimit, RateLimitLayer};
    use tower::{service_fn, Layer, ServiceExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn exports_the_counters_by_tool_only() {
        let exporter = toolshield_metrics::local_prometheus();
        let layer =
            RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(60), 1)).keyed(ByCaller);
        exporter.add_collector(RateLimitMetrics::new(
            "search",
            layer.stats(),
            exporter.target(),
        ));
        let svc = layer.layer(service_fn(|_r: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!(true)))
        }));
        for caller in ["alice", "alice", "bob"] {
            let r = ToolRequest::new("search", json!({})).caller(caller);
            let _ = svc.clone().oneshot(r).await;
        }
        let text = exporter.render();
        assert!(
            text.contains(r#"tool_rate_limit_admitted_total{tool="search"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tool_rate_limit_rejected_total{tool="search"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tool_rate_limit_store_errors_total{tool="search"} 0"#),
            "{text}"
        );
        assert!(!text.contains("alice") && !text.contains("bob"), "{text}");
    }
}
