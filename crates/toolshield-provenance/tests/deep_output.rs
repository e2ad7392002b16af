//! An output the canonical digest refuses (nested deeper than 512 levels) is still a
//! success: stamped without a digest, never turned into an error or a panic.

use serde_json::{json, Value};
use toolshield_core::{payload_digest, ToolError, ToolRequest, ToolResponse};
use toolshield_provenance::ProvenanceLayer;
use tower::{service_fn, ServiceBuilder, ServiceExt};

fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = Value::Array(vec![v]);
    }
    v
}

#[tokio::test(start_paused = true)]
async fn an_output_too_deep_to_digest_stays_a_success_without_a_digest() {
    let deep = nested(600);
    assert!(payload_digest(&deep).is_err(), "the digest refuses it");
    let output = deep.clone();
    let tool = service_fn(move |_req: ToolRequest| {
        let output = output.clone();
        async move { Ok::<_, ToolError>(ToolResponse::new(output)) }
    });
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .service(tool);
    let res = svc
        .oneshot(ToolRequest::new("deep", json!({})))
        .await
        .expect("a success stays a success");
    assert_eq!(res.output, deep);
    let p = &res.provenance;
    assert_eq!(p.response_digest, None);
    assert_eq!(p.tool.as_deref(), Some("deep"));
    assert_eq!(p.attempts, 1);
    assert!(p.fetched_at.is_some());
}
