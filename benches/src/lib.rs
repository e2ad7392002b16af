//! Shared pieces of the criterion benches: the bare tool service every group uses as
//! its baseline, and a payload of the size the budgets are set for.

use std::future::{ready, Ready};
use std::task::{Context, Poll};

use serde_json::{json, Value};
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use tower::Service;

/// The baseline: a tool that answers at once with a fixed output.
///
/// Its output is `true`, which needs no allocation, so every allocation a bench sees
/// belongs to the layers under test.
#[derive(Clone, Copy, Debug, Default)]
pub struct BareTool;

impl BareTool {
    /// The bare tool.
    pub fn new() -> Self {
        BareTool
    }
}

impl Service<ToolRequest> for BareTool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        ready(Ok(ToolResponse::new(Value::Bool(true))))
    }
}

/// A payload of about 200 bytes, the size the cache-hit budget (docs/benchmarks.md) is set for.
pub fn payload_200b() -> Value {
    json!({
        "city": "Paris",
        "country": "FR",
        "units": "metric",
        "days": 3,
        "fields": ["temperature", "humidity", "wind", "precipitation"],
        "lang": "en",
        "caller": "agent-7",
        "options": {"hourly": false, "alerts": true}
    })
}
