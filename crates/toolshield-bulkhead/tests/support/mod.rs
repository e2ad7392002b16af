//! What the bulkhead tests share: a tool held until the test releases it, a request, and
//! a way to let spawned calls reach their wait.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use serde_json::json;
use tokio::sync::Semaphore;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use tower::service_fn;
use tower::util::BoxCloneService;

/// The boxed tool the tests stack the bulkhead on.
pub type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// A tool that waits until the test releases it (one permit per call).
pub fn gated(gate: Arc<Semaphore>) -> Svc {
    BoxCloneService::new(service_fn(move |_req: ToolRequest| {
        let gate = Arc::clone(&gate);
        async move {
            if let Ok(p) = gate.acquire().await {
                p.forget();
            }
            Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
        }
    }))
}

/// A read of the `search` tool.
pub fn req() -> ToolRequest {
    ToolRequest::new("search", json!({}))
}

/// Lets spawned calls run until they wait (for a slot, a queue place or the tool).
pub async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}
