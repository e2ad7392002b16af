//! A hostile or broken MCP peer: a task the server forgets or completes with garbage, a
//! server that dies mid-call, odd JSON-RPC error codes, huge content. A
//! mutation that may have run is never reported as a plain failure (which frees its
//! idempotency key for a repeat to run it again), and messages stay bounded.

mod common;

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CreateTaskResult, DetailedTask,
    ErrorCode, GetTaskParams, GetTaskResult, ServerCapabilities, ServerConfig, Task, TaskPayload,
    TaskStatus,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{json, Value};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_mcp::McpClientService;
use tower::ServiceExt;

const STAMP: &str = "2026-01-01T00:00:00Z";

#[derive(Clone, Default)]
struct Hostile;

fn object(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

impl ServerHandler for Hostile {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
    }

    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::from(req.arguments.clone().unwrap_or_default());
        match &*req.name {
            // Accepted as a task (the charge is under way), then forgotten or garbled.
            "forget" | "garble" | "expire_later" => {
                let task = Task::new(format!("{}-1", req.name), TaskStatus::Working, STAMP, STAMP)
                    .with_poll_interval_ms(10);
                Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
            }
            "code" => {
                let code = args.get("code").and_then(Value::as_i64).unwrap_or(0);
                Err(ErrorData::new(
                    ErrorCode(i32::try_from(code).unwrap_or(i32::MIN)),
                    "odd",
                    None,
                ))
            }
            _ => Err(ErrorData::invalid_params("tool not found", None)),
        }
    }

    async fn get_task(
        &self,
        req: GetTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let task = Task::new(req.task_id.clone(), TaskStatus::Working, STAMP, STAMP);
        match req.task_id.as_str() {
            "forget-1" => Err(ErrorData::invalid_params("task not found", None)),
            "expire_later-1" => Err(ErrorData::internal_error("task store lost", None)),
            "garble-1" => Ok(GetTaskResult::new(DetailedTask::new(
                Task::new("garble-1", TaskStatus::Completed, STAMP, STAMP),
                TaskPayload::Completed {
                    result: object(json!({"content": 5, "isError": "yes"})),
                },
            ))),
            _ => Ok(GetTaskResult::new(DetailedTask::new(
                task,
                TaskPayload::Working,
            ))),
        }
    }

    async fn cancel_task(
        &self,
        _req: CancelTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }
}

async fn call(svc: &McpClientService, req: ToolRequest) -> Result<ToolResponse, ToolError> {
    tokio::time::timeout(Duration::from_secs(60), svc.clone().oneshot(req))
        .await
        .expect("the call ends")
}

fn mutation(tool: &str) -> ToolRequest {
    ToolRequest::new(tool, json!({})).kind(CallKind::Mutating)
}

#[tokio::test(start_paused = true)]
async fn a_mutating_task_the_server_no_longer_knows_is_outcome_unknown() {
    // The server took the call and started a task; a later `tasks/get` says the task is
    // not found (expired, server restarted). The charge may have gone through: as for a
    // resumed task the server forgot, and for an answer that is not a tool result, the
    // outcome is unknown. Today it is NOT_FOUND: a plain failure, the key is freed and a
    // repeat charges again.
    let svc = common::connect_to(Hostile).await;
    let err = call(&svc, mutation("forget")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    let err = call(&svc, mutation("expire_later")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_mutating_task_completed_with_a_malformed_result_is_outcome_unknown() {
    // `completed`: the tool ran. Only its result cannot be read.
    let svc = common::connect_to(Hostile).await;
    let err = call(&svc, mutation("garble")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
}

#[tokio::test(start_paused = true)]
async fn read_only_tasks_that_fail_are_plain_failures() {
    let svc = common::connect_to(Hostile).await;
    let read = |t: &str| ToolRequest::new(t, json!({})).kind(CallKind::ReadOnly);
    let err = call(&svc, read("garble")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed, "{err}");
    let err = call(&svc, read("forget")).await.unwrap_err();
    assert!(!err.kind().is_retriable() || err.kind() == ErrorKind::ConnectionFailed);
}

#[tokio::test(start_paused = true)]
async fn odd_json_rpc_error_codes_have_a_kind() {
    let svc = common::connect_to(Hostile).await;
    for (code, kind) in [
        (-32601, ErrorKind::NotFound),
        (-32002, ErrorKind::NotFound),
        (-32600, ErrorKind::InvalidInput),
        (-32700, ErrorKind::InvalidInput),
        (-32603, ErrorKind::ExecutionFailed),
        (0, ErrorKind::ExecutionFailed),
        (1, ErrorKind::ExecutionFailed),
        (-32000, ErrorKind::ExecutionFailed),
        (i64::from(i32::MIN), ErrorKind::ExecutionFailed),
        (i64::from(i32::MAX), ErrorKind::ExecutionFailed),
    ] {
        let req = ToolRequest::new("code", json!({"code": code})).kind(CallKind::Mutating);
        let err = call(&svc, req).await.unwrap_err();
        assert_eq!(err.kind(), kind, "code {code}: {err}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_server_that_dies_mid_call_is_outcome_unknown_for_a_mutation_only() {
    let (svc, _seen, _task) = common::start().await;
    let err = call(&svc, mutation("vanish")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    // Dead now: nothing can be sent, safe to repeat.
    let err = call(&svc, mutation("echo")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");

    let (svc, _seen, _task) = common::start().await;
    let read = ToolRequest::new("vanish", json!({})).kind(CallKind::ReadOnly);
    let err = call(&svc, read).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");
}

#[tokio::test(start_paused = true)]
async fn huge_content_and_is_error_results_are_typed() {
    let (svc, _seen, _task) = common::start().await;
    let big = "y".repeat(4 << 20);
    let res = call(&svc, ToolRequest::new("echo", json!({ "big": big })))
        .await
        .unwrap();
    assert_eq!(
        res.output["structuredContent"]["big"]
            .as_str()
            .map(str::len),
        Some(4 << 20)
    );
    let res = call(&svc, ToolRequest::new("broken", json!({})))
        .await
        .unwrap();
    assert_eq!(res.output["isError"], true);
}
