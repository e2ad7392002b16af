//! The cancellation layer around plain tower services.

use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use toolshield_cancel::CancelLayer;
use toolshield_core::{BoxError, ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, Layer, Service, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_request_without_call_state_passes_through_untouched() {
    let svc = CancelLayer::new().layer(service_fn(|req: String| async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok::<_, BoxError>(format!("{req}!"))
    }));
    assert_eq!(svc.oneshot(String::from("hi")).await.unwrap(), "hi!");

    let failing = CancelLayer::new().layer(service_fn(|_req: String| async move {
        Err::<String, BoxError>(Box::new(ToolError::new(
            ErrorKind::NotFound,
            "no such page",
        )))
    }));
    let e = failing.oneshot(String::from("x")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
}

#[derive(Clone)]
struct ClosedPool;

impl Service<ToolRequest> for ClosedPool {
    type Response = ToolResponse;
    type Error = BoxError;
    type Future = std::future::Ready<Result<ToolResponse, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Err(Box::new(ToolError::new(
            ErrorKind::UpstreamUnavailable,
            "pool closed",
        ))))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        std::future::ready(Ok(ToolResponse::new(json!("unreachable"))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_readiness_error_passes_through() {
    let mut svc = CancelLayer::new().layer(ClosedPool);
    let e = std::future::poll_fn(|cx| svc.poll_ready(cx))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
}
