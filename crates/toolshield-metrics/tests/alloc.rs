//! Recording a call allocates no label strings: after the first call of each label set,
//! the outer and attempt metrics layers allocate nothing per call (the Prometheus
//! histogram's sample buffer grows by one block per many samples, and is bounded here).

use std::alloc::System;

use serde_json::Value;
use toolshield_core::ToolRequest;
use toolshield_metrics::{local_prometheus, MetricsConfig, MetricsLayer};
use toolshield_test::alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::BareTool;
use tower::{Layer, Service, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn metrics_layers_allocate_nothing_per_call() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let exporter = local_prometheus();
    let layer = MetricsLayer::build(
        MetricsConfig::with_tools(["weather", "search"]),
        exporter.target(),
    )
    .unwrap();
    let tool = BareTool;
    // The outer layer only: no per-call slot is needed without an attempt layer.
    let mut svc = layer.layer(tool);
    // A request built for each call (a clone of one template would get tokens of its
    // own from the first layer: an allocation that is not the metrics layer's), made
    // before the measured part.
    let requests = |n: usize| -> Vec<ToolRequest> {
        (0..n)
            .flat_map(|_| {
                [
                    ToolRequest::new("weather", Value::Null),
                    ToolRequest::new("unlisted", Value::Null),
                ]
            })
            .collect()
    };
    let mut run = |requests: Vec<ToolRequest>| {
        rt.block_on(async {
            for req in requests {
                let s = svc.ready().await.unwrap();
                s.call(req).await.unwrap();
            }
        })
    };
    run(requests(10)); // registers the handles
    exporter.run_upkeep();

    let calls = 2_000;
    let batch = requests(calls / 2);
    let region = Region::new(GLOBAL);
    run(batch);
    let stats = region.change();
    eprintln!("{} allocations for {calls} calls", stats.allocations);
    // The histogram buffers samples in blocks until the next upkeep: a handful of block
    // allocations for 2000 samples, never one per call.
    assert!(
        stats.allocations * 20 < calls,
        "{} allocations for {calls} calls",
        stats.allocations
    );
    exporter.run_upkeep();
    let text = exporter.render();
    assert!(
        text.contains(r#"tool_execution_total{tool="weather",status="success"} 1010"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tool_execution_total{tool="other",status="success"} 1010"#),
        "{text}"
    );
}
