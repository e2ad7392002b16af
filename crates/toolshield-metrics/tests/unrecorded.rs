//! A call whose idempotency record could not be written is counted, per tool.

mod support;

use serde_json::json;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::{local_prometheus, MetricsConfig, MetricsLayer};
use tower::{service_fn, ServiceBuilder, ServiceExt};

use support::{labels_of, parse};

#[tokio::test(start_paused = true)]
async fn an_unrecorded_result_is_counted_for_its_tool() {
    let exporter = local_prometheus();
    let metrics =
        MetricsLayer::build(MetricsConfig::with_tools(["pay"]), exporter.target()).unwrap();
    let svc =
        ServiceBuilder::new()
            .layer(metrics)
            .service(service_fn(|req: ToolRequest| async move {
                let mut resp = ToolResponse::new(json!({"charge": 1}));
                // What the idempotency layer says when the store lost the record.
                resp.provenance.unrecorded = req.payload()["lost"] == json!(true);
                Ok::<_, ToolError>(resp)
            }));
    for lost in [true, false, true] {
        let req = ToolRequest::new("pay", json!({ "lost": lost }));
        svc.clone().oneshot(req).await.unwrap();
    }
    let exp = parse(&exporter.render()).expect("valid exposition");
    let series = exp.series("idempotency_unrecorded_total");
    assert_eq!(
        series.get(&labels_of(&[("tool", "pay")])),
        Some(&2.0),
        "{series:?}"
    );
}
