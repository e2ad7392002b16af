//! The strict exposition parser (`toolshield_test::exposition`) and the metered bare tool
//! the metrics tests share.

#![allow(dead_code, unreachable_pub, unused_imports)]

pub use toolshield_test::exposition::{labels_of, parse, Exposition, Labels};

/// The successful calls of `tool` an exposition counts (`tool_duration_seconds_count`
/// with `status="success"`); `None` when `text` does not parse or has no such series.
pub fn successes(text: &str, tool: &str) -> Option<f64> {
    parse(text).ok()?.value(
        "tool_duration_seconds_count",
        &[("tool", tool), ("status", "success")],
    )
}

/// The metrics layer of tool `weather`, recording into `exporter`, around the bare tool.
pub fn metered(
    exporter: &toolshield_metrics::PrometheusExporter,
) -> toolshield_metrics::Metrics<toolshield_test::BareTool> {
    use tower::Layer;
    toolshield_metrics::MetricsLayer::build(
        toolshield_metrics::MetricsConfig::with_tools(["weather"]),
        exporter.target(),
    )
    .unwrap()
    .layer(toolshield_test::BareTool)
}
