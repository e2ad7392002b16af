//! What the retry tests share: outcomes for `toolshield_test::ScriptedTool`, and the
//! request they retry.

#![allow(dead_code, unreachable_pub)]

use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};

pub fn err(kind: ErrorKind) -> Result<ToolResponse, ToolError> {
    Err(ToolError::new(kind, "scripted failure"))
}

pub fn ok() -> Result<ToolResponse, ToolError> {
    Ok(ToolResponse::new(json!({"temp": 21})))
}

pub fn read_request() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly)
}
