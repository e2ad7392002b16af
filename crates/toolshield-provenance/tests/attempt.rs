//! `AttemptProvenanceLayer`: names the attempt that produced a response, keeps a name the
//! tool gave, and passes through request types without attempt ids.

use serde_json::json;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_provenance::AttemptProvenanceLayer;
use tower::{service_fn, Layer, ServiceExt};
use uuid::Uuid;

#[tokio::test]
async fn names_the_attempt_it_saw() {
    let svc = AttemptProvenanceLayer::new().layer(service_fn(|_req: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!(1)))
    }));
    let req = ToolRequest::new("t", json!({}));
    let id = req.execution_id();
    let res = svc.oneshot(req).await.expect("answers");
    assert_eq!(res.provenance.execution_id, Some(id));
}

#[tokio::test]
async fn keeps_the_id_a_tool_named() {
    let own = Uuid::from_u128(7);
    let svc =
        AttemptProvenanceLayer::new().layer(service_fn(move |_req: ToolRequest| async move {
            let mut res = ToolResponse::new(json!(1));
            res.provenance.execution_id = Some(own);
            Ok::<_, ToolError>(res)
        }));
    let res = svc
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .expect("answers");
    assert_eq!(res.provenance.execution_id, Some(own));
}

#[tokio::test]
async fn a_request_without_attempt_ids_names_nothing() {
    let svc = AttemptProvenanceLayer::new().layer(service_fn(|_req: String| async {
        Ok::<_, ToolError>(ToolResponse::new(json!(1)))
    }));
    let res = svc.oneshot("plain".to_owned()).await.expect("answers");
    assert_eq!(res.provenance.execution_id, None);
}
