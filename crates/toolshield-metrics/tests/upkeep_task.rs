//! The exporter drains its recorder by itself: the upkeep task starts inside a tokio
//! runtime (at creation, or at first use when created outside one) and ends once nothing
//! can record into the recorder, so it never keeps a dropped exporter's memory alive.

use std::time::Duration;

use serde_json::json;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::metrics_exporter_prometheus::PrometheusBuilder;
use toolshield_metrics::{
    local_prometheus, MetricsConfig, MetricsLayer, MetricsTarget, PrometheusExporter,
    UPKEEP_INTERVAL,
};
use tower::{service_fn, Layer, ServiceExt};

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Lets the upkeep task see a tick after `d`.
async fn pass(d: Duration) {
    tokio::time::advance(d).await;
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn upkeep_of_a_local_recorder_ends_when_exporter_and_layers_are_dropped() {
    assert_eq!(alive_tasks(), 0);
    let exporter = local_prometheus();
    assert!(exporter.upkeep_running());
    assert_eq!(alive_tasks(), 1, "the exporter started its upkeep task");

    let layer =
        MetricsLayer::build(MetricsConfig::with_tools(["weather"]), exporter.target()).unwrap();
    drop(exporter);
    pass(UPKEEP_INTERVAL * 2).await;
    // The layer still records into the recorder: the task keeps draining it.
    let tool = service_fn(|_req: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!(true)))
    });
    layer
        .layer(tool)
        .oneshot(ToolRequest::new("weather", json!({})))
        .await
        .unwrap();
    assert_eq!(alive_tasks(), 1);

    drop(layer);
    pass(UPKEEP_INTERVAL + Duration::from_millis(1)).await;
    assert_eq!(
        alive_tasks(),
        0,
        "nothing can record any more: the task ended"
    );
}

#[tokio::test(start_paused = true)]
async fn upkeep_of_the_global_target_ends_when_every_exporter_clone_is_dropped() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let exporter = PrometheusExporter::from_parts(recorder.handle(), MetricsTarget::Global);
    let clone = exporter.clone();
    assert_eq!(alive_tasks(), 1, "one task for all clones");
    drop(exporter);
    pass(UPKEEP_INTERVAL * 2).await;
    assert!(clone.upkeep_running());
    drop(clone);
    pass(UPKEEP_INTERVAL + Duration::from_millis(1)).await;
    assert_eq!(alive_tasks(), 0);
    drop(recorder);
}

#[test]
fn exporter_created_outside_a_runtime_starts_its_upkeep_when_used_inside_one() {
    let exporter = local_prometheus();
    assert!(!exporter.upkeep_running(), "no runtime, no task");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let _target = exporter.target();
        assert!(exporter.upkeep_running());
    });
    drop(rt);
    assert!(
        !exporter.upkeep_running(),
        "the runtime's shutdown ended it"
    );

    // Another runtime: the next use starts it again.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let _ = exporter.render();
        assert!(exporter.upkeep_running());
    });
}

#[tokio::test(start_paused = true)]
async fn spawn_upkeep_replaces_the_automatic_task() {
    let exporter = local_prometheus();
    assert_eq!(alive_tasks(), 1, "the automatic task");
    let task = exporter.spawn_upkeep(Duration::from_secs(1));
    pass(Duration::from_millis(1)).await;
    assert_eq!(alive_tasks(), 1, "the automatic task was replaced");
    task.abort();
    pass(Duration::from_millis(1)).await;
    assert!(!exporter.upkeep_running());
}
