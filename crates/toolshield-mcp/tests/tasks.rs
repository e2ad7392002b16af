//! A `tools/call` that the server turns into an MCP task is one logical call: polled
//! with backoff to its end, cancelled with `tasks/cancel` when the call is cancelled,
//! times out or is dropped.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CancelledNotificationParam, ContentBlock, CreateTaskResult, DetailedTask, GetTaskParams,
    GetTaskResult, ServerCapabilities, ServerConfig, Task, TaskPayload, TaskStatus,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield::prelude::*;
use toolshield::timeout::TimeoutLayer;
use toolshield_mcp::{McpClientService, RELATED_TASK_META};
use tower::{Layer as _, ServiceExt as _};

const STAMP: &str = "2026-01-01T00:00:00Z";
const HINT_MS: u64 = 100;

#[derive(Clone, Copy)]
enum Plan {
    /// Working for two polls, then completed.
    Finish,
    /// Working for one poll, then failed with invalid params.
    Fail,
    /// Working until cancelled.
    Forever,
    /// Cancelled by the server at the first poll.
    ServerCancels,
    /// A 1 MiB task id, failed at the first poll with an error that is not a JSON-RPC
    /// error object.
    Hostile,
}

#[derive(Default)]
struct Log {
    tasks: Mutex<HashMap<String, (Plan, u32)>>,
    /// When each `tasks/get` arrived.
    polls: Mutex<Vec<Instant>>,
    /// Task ids of every `tasks/cancel`.
    cancels: Mutex<Vec<String>>,
    /// `notifications/cancelled` received.
    notices: Mutex<u32>,
    changed: Notify,
}

impl Log {
    fn cancels(&self) -> Vec<String> {
        self.cancels.lock().unwrap().clone()
    }

    async fn until(&self, what: &str, done: impl Fn(&Log) -> bool) {
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let changed = self.changed.notified();
                if done(self) {
                    return;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server never saw: {what}"));
    }
}

#[derive(Clone, Default)]
struct TaskServer {
    log: Arc<Log>,
}

fn task(id: &str) -> Task {
    Task::new(id, TaskStatus::Working, STAMP, STAMP).with_poll_interval_ms(HINT_MS)
}

fn object(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

impl ServerHandler for TaskServer {
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
        let plan = match &*req.name {
            "finish" => Plan::Finish,
            "fail" => Plan::Fail,
            "forever" => Plan::Forever,
            "server_cancels" => Plan::ServerCancels,
            "hostile" => Plan::Hostile,
            _ => return Err(ErrorData::invalid_params("tool not found", None)),
        };
        let id = {
            let mut tasks = self.log.tasks.lock().unwrap();
            let id = match plan {
                Plan::Hostile => "h".repeat(1 << 20),
                _ => format!("task-{}-{}", req.name, tasks.len()),
            };
            tasks.insert(id.clone(), (plan, 0));
            id
        };
        self.log.changed.notify_waiters();
        Ok(CallToolResponse::Task(CreateTaskResult::new(task(&id))))
    }

    async fn get_task(
        &self,
        req: GetTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.log.polls.lock().unwrap().push(Instant::now());
        let payload = {
            let mut tasks = self.log.tasks.lock().unwrap();
            let Some((plan, polls)) = tasks.get_mut(&req.task_id) else {
                return Err(ErrorData::invalid_params("unknown task", None));
            };
            *polls += 1;
            match (*plan, *polls) {
                (Plan::Finish, n) if n >= 3 => TaskPayload::Completed {
                    result: object(
                        serde_json::to_value(CallToolResult::success(vec![ContentBlock::text(
                            "finished",
                        )]))
                        .unwrap(),
                    ),
                },
                (Plan::Fail, n) if n >= 2 => TaskPayload::Failed {
                    error: object(json!({"code": -32602, "message": "`n` must be a number"})),
                },
                (Plan::ServerCancels, _) => TaskPayload::Cancelled,
                (Plan::Hostile, _) => TaskPayload::Failed {
                    error: object(json!({"bogus": "x".repeat(1 << 20)})),
                },
                _ => TaskPayload::Working,
            }
        };
        self.log.changed.notify_waiters();
        Ok(GetTaskResult::new(DetailedTask::new(
            task(&req.task_id),
            payload,
        )))
    }

    async fn cancel_task(
        &self,
        req: CancelTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.log.cancels.lock().unwrap().push(req.task_id);
        self.log.changed.notify_waiters();
        Ok(())
    }

    async fn on_cancelled(
        &self,
        _notification: CancelledNotificationParam,
        _cx: NotificationContext<RoleServer>,
    ) {
        *self.log.notices.lock().unwrap() += 1;
        self.log.changed.notify_waiters();
    }
}

async fn start() -> (McpClientService, Arc<Log>) {
    let server = TaskServer::default();
    let log = server.log.clone();
    let client = common::connect_to(server).await;
    (client, log)
}

fn read(tool: &str) -> ToolRequest {
    ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly)
}

/// Lets queued messages reach the server. The tests keep a clone of the client: the
/// connection lives as long as one does.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_is_polled_to_its_result_as_one_call() {
    let (client, log) = start().await;
    let begun = Instant::now();

    let res = client
        .clone()
        .oneshot(read("finish"))
        .await
        .expect("the task completes");

    assert_eq!(res.output["content"][0]["text"], "finished");
    assert!(!res.is_error());
    assert_eq!(
        res.output["_meta"][RELATED_TASK_META]["taskId"], "task-finish-0",
        "the task id is recorded"
    );
    let polls = log.polls.lock().unwrap().clone();
    assert_eq!(polls.len(), 3, "polled until completed");
    // The server's poll interval (100 ms) is longer than the first backoff steps: honoured.
    let mut last = begun;
    for at in &polls {
        assert!(*at - last >= Duration::from_millis(HINT_MS), "{polls:?}");
        last = *at;
    }
    settle().await;
    assert!(log.cancels().is_empty(), "a finished task is not cancelled");
    assert_eq!(*log.notices.lock().unwrap(), 0, "no notice after an answer");
}

#[tokio::test(start_paused = true)]
async fn a_failed_task_maps_like_a_protocol_error() {
    let (client, log) = start().await;

    let err = client
        .clone()
        .oneshot(read("fail"))
        .await
        .expect_err("the task failed");

    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("must be a number"), "{err}");
    settle().await;
    assert!(log.cancels().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_task_the_server_cancelled_is_an_execution_failure() {
    let (client, log) = start().await;

    let err = client
        .oneshot(read("server_cancels"))
        .await
        .expect_err("cancelled by the server");

    assert_eq!(err.kind(), ErrorKind::ExecutionFailed, "{err}");
    settle().await;
    assert!(log.cancels().is_empty(), "nothing left to cancel");
}

#[tokio::test(start_paused = true)]
async fn caller_cancel_cancels_the_task_once() {
    let (client, log) = start().await;
    let token = CancellationToken::new();
    let call = tokio::spawn(
        client
            .clone()
            .oneshot(read("forever").cancel_token(token.clone())),
    );
    log.until("two polls", |l| l.polls.lock().unwrap().len() >= 2)
        .await;

    token.cancel();
    let err = call.await.unwrap().expect_err("cancelled");

    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    log.until("tasks/cancel", |l| !l.cancels.lock().unwrap().is_empty())
        .await;
    settle().await;
    assert_eq!(log.cancels(), vec!["task-forever-0".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_cancels_the_task_once() {
    let (client, log) = start().await;
    let svc = TimeoutLayer::new(Duration::from_secs(1)).layer(client.clone());
    let begun = Instant::now();

    let err = svc.oneshot(read("forever")).await.expect_err("times out");

    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(begun.elapsed(), Duration::from_secs(1));
    log.until("tasks/cancel", |l| !l.cancels.lock().unwrap().is_empty())
        .await;
    settle().await;
    assert_eq!(log.cancels(), vec!["task-forever-0".to_owned()]);
    let polls = log.polls.lock().unwrap().len();
    assert!(polls >= 3, "polled while the attempt ran: {polls}");
}

#[tokio::test(start_paused = true)]
async fn the_request_deadline_bounds_polling_without_a_timeout_layer() {
    let (client, log) = start().await;
    let begun = Instant::now();
    let req = read("forever").deadline(begun + Duration::from_millis(750));

    let err = client.clone().oneshot(req).await.expect_err("deadline");

    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(
        begun.elapsed(),
        Duration::from_millis(750),
        "stops at the deadline"
    );
    log.until("tasks/cancel", |l| !l.cancels.lock().unwrap().is_empty())
        .await;
    settle().await;
    assert_eq!(log.cancels(), vec!["task-forever-0".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_cancels_the_task_once() {
    let (client, log) = start().await;
    let call = client.clone().oneshot(read("forever"));
    tokio::select! {
        _ = call => panic!("the task never ends on its own"),
        () = log.until("a poll", |l| !l.polls.lock().unwrap().is_empty()) => {}
    }

    log.until("tasks/cancel", |l| !l.cancels.lock().unwrap().is_empty())
        .await;
    settle().await;
    assert_eq!(log.cancels(), vec!["task-forever-0".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_hostile_task_id_and_error_cannot_blow_up_the_error_message() {
    let (client, _log) = start().await;

    let err = client
        .clone()
        .oneshot(read("hostile"))
        .await
        .expect_err("the task failed");

    assert_eq!(err.kind(), ErrorKind::ExecutionFailed, "{err}");
    assert!(
        err.to_string().len() < 2048,
        "{} bytes",
        err.to_string().len()
    );
}

/// The poll that says "completed" is already in when the caller's token fires: the call
/// returns the task's result, and the finished task is not sent `tasks/cancel`.
#[tokio::test(start_paused = true)]
async fn a_completion_that_arrived_before_the_cancel_is_returned_and_not_cancelled() {
    let (client, log) = start().await;
    let token = CancellationToken::new();
    let mut call = std::pin::pin!(client
        .clone()
        .oneshot(read("finish").cancel_token(token.clone())));
    // Drive the call by hand until the server has answered its third poll (completed):
    // the paused clock moves only once every task is idle, so after each short sleep the
    // server's answers have reached the client, and the call has not looked at them yet.
    loop {
        let polled = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(call.as_mut(), cx))
        })
        .await;
        assert!(
            polled.is_pending(),
            "the task is not done before its third poll"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        if log.polls.lock().unwrap().len() >= 3 {
            break;
        }
    }
    token.cancel();

    let res = call.await.expect("the completed task's result");
    assert_eq!(res.output["content"][0]["text"], "finished");
    settle().await;
    assert!(log.cancels().is_empty(), "a finished task is not cancelled");
}
