//! The server's progress reaches the call: `notifications/progress` for the call's token
//! (and a task's working polls and status notifications) reset the attempt timeout's idle
//! limit and are counted for provenance; nothing else does, and nothing is left behind.
//!
//! A real rmcp server runs in-process over `tokio::io::duplex`, on tokio's paused clock
//! (the in-memory transport needs no real time).

mod common;

use common::{arg_u64 as arg, done};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult,
    DetailedTask, GetTaskParams, GetTaskResult, NumberOrString, ProgressNotificationParam,
    ProgressToken, ServerCapabilities, ServerConfig, ServerNotification, Task, TaskPayload,
    TaskStatus, TaskStatusNotification, TaskStatusNotificationParams,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RoleClient, RoleServer};
use rmcp::{ClientHandler, ErrorData, ServerHandler, ServiceExt as _};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::time::Instant;
use toolshield::prelude::*;
use toolshield::provenance::ProvenanceLayer;
use toolshield::shield::Shield;
use toolshield::timeout::TimeoutLayer;
use toolshield_mcp::{McpClientService, ProgressRouter, WithProgress};
use tower::{ServiceBuilder, ServiceExt as _};

const STAMP: &str = "2026-01-01T00:00:00Z";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// What the server did.
#[derive(Default)]
struct Log {
    /// `tools/call`s that started.
    started: AtomicU32,
    /// Progress notifications the server sent (any token).
    sent: AtomicU32,
    /// Task status notifications the server sent.
    statuses: AtomicU32,
    /// `tasks/get` received.
    polls: AtomicU32,
    /// Tasks: id -> (when created, how long they work, poll interval hint in ms).
    tasks: Mutex<HashMap<String, (Instant, Duration, u64)>>,
    changed: Notify,
}

impl Log {
    /// Waits (at most 600 s of the paused clock) until `done` holds.
    async fn until(&self, what: &str, done: impl Fn(&Log) -> bool) {
        common::until(&self.changed, what, || done(self)).await;
    }
}

/// - `report {every, count, tail, other}`: `count` progress notifications, one every
///   `every` seconds (for another token when `other` is 1), then answers `tail` seconds
///   later; stops when the client cancels the request;
/// - `late`: one report, the answer, and one more report with the same token 1 s later;
/// - `task {work, hint_ms, status_every, progress_every}`: answers with a task that works
///   for `work` seconds, suggests polling every `hint_ms`, and meanwhile sends a working
///   status notification every `status_every` seconds and a progress notification (with
///   the `tools/call`'s token) every `progress_every` seconds (0: none).
#[derive(Clone, Default)]
struct ProgressServer {
    log: Arc<Log>,
}

impl ProgressServer {
    async fn report(&self, peer: &Peer<RoleServer>, token: ProgressToken, n: u64, total: u64) {
        let param = ProgressNotificationParam::new(token, n as f64)
            .with_total(total as f64)
            .with_message(format!("step {n}"));
        let _ = peer.notify_progress(param).await;
        self.log.sent.fetch_add(1, Ordering::SeqCst);
        self.log.changed.notify_waiters();
    }
}

fn working(id: &str, hint_ms: u64) -> DetailedTask {
    let mut task = Task::new(id, TaskStatus::Working, STAMP, STAMP).with_status_message("busy");
    if hint_ms > 0 {
        task = task.with_poll_interval_ms(hint_ms);
    }
    DetailedTask::new(task, TaskPayload::Working)
}

impl ServerHandler for ProgressServer {
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
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::from(req.arguments.clone().unwrap_or_default());
        let own = cx
            .meta
            .get_progress_token()
            .ok_or_else(|| ErrorData::invalid_params("no progress token", None))?;
        self.log.started.fetch_add(1, Ordering::SeqCst);
        self.log.changed.notify_waiters();
        match &*req.name {
            "report" => {
                let token = if arg(&args, "other") == 1 {
                    ProgressToken(NumberOrString::String("not-yours".into()))
                } else {
                    own
                };
                let count = arg(&args, "count");
                let work = async {
                    for n in 1..=count {
                        tokio::time::sleep(secs(arg(&args, "every"))).await;
                        self.report(&cx.peer, token.clone(), n, count).await;
                    }
                    tokio::time::sleep(secs(arg(&args, "tail"))).await;
                };
                tokio::select! {
                    () = work => Ok(done()),
                    () = cx.ct.cancelled() => Err(ErrorData::internal_error("cancelled", None)),
                }
            }
            "late" => {
                self.report(&cx.peer, own.clone(), 1, 2).await;
                let this = self.clone();
                let peer = cx.peer.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(secs(1)).await;
                    this.report(&peer, own, 2, 2).await;
                });
                Ok(done())
            }
            "task" => {
                let id = format!("task-{}", self.log.started.load(Ordering::SeqCst));
                let work = secs(arg(&args, "work"));
                let hint = arg(&args, "hint_ms");
                self.log
                    .tasks
                    .lock()
                    .unwrap()
                    .insert(id.clone(), (Instant::now(), work, hint));
                let until = Instant::now() + work;
                let status_every = arg(&args, "status_every");
                if status_every > 0 {
                    let (log, peer, id) = (self.log.clone(), cx.peer.clone(), id.clone());
                    tokio::spawn(async move {
                        loop {
                            tokio::time::sleep(secs(status_every)).await;
                            if Instant::now() >= until {
                                return;
                            }
                            let status = ServerNotification::TaskStatusNotification(
                                TaskStatusNotification::new(TaskStatusNotificationParams::new(
                                    working(&id, hint),
                                )),
                            );
                            let _ = peer.send_notification(status).await;
                            log.statuses.fetch_add(1, Ordering::SeqCst);
                        }
                    });
                }
                let progress_every = arg(&args, "progress_every");
                if progress_every > 0 {
                    let (this, peer) = (self.clone(), cx.peer.clone());
                    tokio::spawn(async move {
                        for n in 1.. {
                            tokio::time::sleep(secs(progress_every)).await;
                            if Instant::now() >= until {
                                return;
                            }
                            this.report(&peer, own.clone(), n, 0).await;
                        }
                    });
                }
                Ok(CallToolResponse::Task(CreateTaskResult::new(
                    working(&id, hint).task,
                )))
            }
            _ => Err(ErrorData::invalid_params("tool not found", None)),
        }
    }

    async fn get_task(
        &self,
        req: GetTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.log.polls.fetch_add(1, Ordering::SeqCst);
        let Some((created, work, hint)) = self.log.tasks.lock().unwrap().get(&req.task_id).copied()
        else {
            return Err(ErrorData::invalid_params("unknown task", None));
        };
        let task = if created.elapsed() >= work {
            let result = serde_json::to_value(CallToolResult::success(vec![ContentBlock::text(
                "finished",
            )]))
            .unwrap();
            let Value::Object(result) = result else {
                unreachable!("a result is an object")
            };
            DetailedTask::new(
                Task::new(&req.task_id, TaskStatus::Completed, STAMP, STAMP),
                TaskPayload::Completed { result },
            )
        } else {
            working(&req.task_id, hint)
        };
        Ok(GetTaskResult::new(task))
    }
}

fn spawn_server(io: tokio::io::DuplexStream) -> Arc<Log> {
    let server = ProgressServer::default();
    let log = server.log.clone();
    tokio::spawn(async move {
        if let Ok(running) = server.serve(io).await {
            let _ = running.waiting().await;
        }
    });
    log
}

async fn start() -> (McpClientService, ProgressRouter, Arc<Log>) {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let log = spawn_server(server_io);
    let client = McpClientService::connect(client_io)
        .await
        .expect("client connects");
    let router = client
        .progress_router()
        .expect("connect routes progress")
        .clone();
    (client, router, log)
}

fn call(tool: &str, args: Value) -> ToolRequest {
    ToolRequest::new(tool, args).kind(CallKind::ReadOnly)
}

/// Counts the reports that reach the caller.
fn counted(req: ToolRequest) -> (ToolRequest, Arc<AtomicU64>) {
    let seen = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&seen);
    let req = req.on_progress(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    });
    (req, seen)
}

/// Lets notifications already sent reach the client's handler.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// One attempt: 60 s hard maximum, 10 s idle limit, from a shield's configuration.
const IDLE: &str = r#"
[defaults]
kind = "read_only"
timeout = { attempt = "60s", idle = "10s" }
retry = { max_attempts = 1 }
"#;

fn shield() -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(IDLE).expect("valid config"))
        .expect("valid shield")
}

/// 60 s hard maximum, 10 s idle limit, as layers.
fn idle_limit() -> TimeoutLayer {
    TimeoutLayer::new(secs(60)).idle(secs(10))
}

#[tokio::test(start_paused = true)]
async fn progress_every_5s_keeps_a_30s_call_alive_under_a_10s_idle_limit() {
    let (client, router, log) = start().await;
    let svc = shield().wrap("report", client);
    let begun = Instant::now();

    let res = svc
        .oneshot(call("report", json!({"every": 5, "count": 6, "tail": 1})))
        .await
        .expect("each report resets the idle limit");

    assert_eq!(begun.elapsed(), secs(31));
    assert_eq!(res.output["content"][0]["text"], "done");
    assert_eq!(log.sent.load(Ordering::SeqCst), 6);
    assert_eq!(
        res.provenance.progress_reports, 6,
        "one report per notification"
    );
    assert_eq!(res.provenance.progress_message.as_deref(), Some("step 6"));
    assert!(router.is_empty(), "the registration is gone after success");
}

#[tokio::test(start_paused = true)]
async fn reports_carry_the_servers_values() {
    let (client, _router, _log) = start().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let events = Arc::clone(&seen);
    let req = call("report", json!({"every": 1, "count": 2})).on_progress(move |e| {
        events
            .lock()
            .unwrap()
            .push((e.progress, e.total, e.message.map(str::to_owned)));
    });
    let svc = ServiceBuilder::new().layer(idle_limit()).service(client);

    svc.oneshot(req).await.expect("answers");

    let mut seen = seen.lock().unwrap().clone();
    // Each notification is handled on its own task: the order is not guaranteed.
    seen.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    assert_eq!(
        seen,
        vec![
            (Some(1.0), Some(2.0), Some("step 1".to_owned())),
            (Some(2.0), Some(2.0), Some("step 2".to_owned())),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_tool_is_cut_at_the_idle_limit() {
    let (client, router, log) = start().await;
    let svc = shield().wrap("report", client);
    let begun = Instant::now();

    let err = svc
        .oneshot(call("report", json!({"count": 0, "tail": 1000})))
        .await
        .expect_err("no progress for 10 s");

    assert_eq!(begun.elapsed(), secs(10));
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert_eq!(log.started.load(Ordering::SeqCst), 1);
    assert!(
        router.is_empty(),
        "the registration is gone after a timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn the_hard_maximum_cuts_a_tool_that_keeps_reporting() {
    let (client, router, log) = start().await;
    // Reports at 7, 14, ..., 56 s: never 10 s without one, cut at 60 s all the same.
    let (req, reports) = counted(call("report", json!({"every": 7, "count": 1000})));
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(idle_limit())
        .service(client);
    let begun = Instant::now();

    let err = svc.oneshot(req).await.expect_err("the hard maximum");

    assert_eq!(begun.elapsed(), secs(60));
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("attempt exceeded 60s"), "{err}");
    assert_eq!(reports.load(Ordering::SeqCst), 8);
    assert_eq!(log.sent.load(Ordering::SeqCst), 8);
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_report_for_another_token_does_not_reset_the_idle_limit() {
    let (client, router, log) = start().await;
    let (req, reports) = counted(call(
        "report",
        json!({"every": 5, "count": 1000, "other": 1}),
    ));
    let svc = ServiceBuilder::new().layer(idle_limit()).service(client);
    let begun = Instant::now();

    let err = svc.oneshot(req).await.expect_err("cut at the idle limit");

    assert_eq!(begun.elapsed(), secs(10));
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert!(
        log.sent.load(Ordering::SeqCst) >= 1,
        "the server did report, for another token"
    );
    assert_eq!(reports.load(Ordering::SeqCst), 0);
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_leaves_no_registration() {
    let (client, router, log) = start().await;
    let (req, reports) = counted(call("report", json!({"every": 5, "count": 1000})));
    let mut call = Box::pin(client.clone().oneshot(req));

    tokio::select! {
        r = &mut call => panic!("the call ended: {r:?}"),
        () = log.until("a report", |l| l.sent.load(Ordering::SeqCst) >= 1) => {}
    }
    settle().await;
    assert_eq!(router.len(), 1, "registered while in flight");
    assert_eq!(reports.load(Ordering::SeqCst), 1);

    drop(call);
    assert!(router.is_empty(), "removed when the future is dropped");
    // The server, told to stop, may still have a report on the wire: it goes nowhere.
    tokio::time::sleep(secs(20)).await;
    assert_eq!(reports.load(Ordering::SeqCst), 1);
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_call_cancelled_by_its_token_leaves_no_registration() {
    let (client, router, log) = start().await;
    let (req, _reports) = counted(call("report", json!({"every": 5, "count": 1000})));
    let token = req.call_token().clone();
    let call = tokio::spawn(client.clone().oneshot(req));

    log.until("the call", |l| l.started.load(Ordering::SeqCst) == 1)
        .await;
    settle().await;
    assert_eq!(router.len(), 1);
    token.cancel();
    let err = call.await.unwrap().expect_err("cancelled");

    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_report_after_the_answer_goes_nowhere() {
    let (client, router, log) = start().await;
    // No timeout layer: no idle clock closes the request's handle; only the router
    // keeps the late report away.
    let (req, reports) = counted(call("late", json!({})));

    client.clone().oneshot(req).await.expect("answers");
    log.until("the late report", |l| l.sent.load(Ordering::SeqCst) == 2)
        .await;
    settle().await;

    assert!(
        reports.load(Ordering::SeqCst) <= 1,
        "the report sent after the answer reached the caller"
    );
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_unobserved_call_registers_nothing() {
    let (client, router, log) = start().await;
    // No idle limit, no callback, no provenance: nothing would come of a report.
    let call = tokio::spawn(
        client
            .clone()
            .oneshot(call("report", json!({"every": 5, "count": 2}))),
    );
    log.until("a report", |l| l.sent.load(Ordering::SeqCst) >= 1)
        .await;
    settle().await;
    assert!(router.is_empty());
    assert!(call.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_each_get_their_own_reports() {
    let (client, router, _log) = start().await;
    let svc = ServiceBuilder::new().layer(idle_limit()).service(client);
    let (a, seen_a) = counted(call("report", json!({"every": 2, "count": 3, "tail": 1})));
    let (b, seen_b) = counted(call("report", json!({"every": 3, "count": 5, "tail": 1})));

    let (ra, rb) = tokio::join!(svc.clone().oneshot(a), svc.clone().oneshot(b));

    assert!(ra.is_ok() && rb.is_ok(), "{ra:?} {rb:?}");
    assert_eq!(seen_a.load(Ordering::SeqCst), 3);
    assert_eq!(seen_b.load(Ordering::SeqCst), 5);
    assert!(router.is_empty());
}

// MCP tasks.

#[tokio::test(start_paused = true)]
async fn a_polled_task_survives_the_idle_limit_while_it_is_working() {
    let (client, router, log) = start().await;
    // Polled every 2 s at most (toolshield's backoff): each working poll is a heartbeat.
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(idle_limit())
        .service(client);
    let begun = Instant::now();

    let res = svc
        .oneshot(call("task", json!({"work": 30})))
        .await
        .expect("the task completes");

    assert!(begun.elapsed() >= secs(30), "{:?}", begun.elapsed());
    assert_eq!(res.output["content"][0]["text"], "finished");
    let polls = u64::from(log.polls.load(Ordering::SeqCst));
    assert_eq!(
        res.provenance.progress_reports,
        polls - 1,
        "every working poll counts, the completing one does not"
    );
    assert_eq!(res.provenance.progress_message.as_deref(), Some("busy"));
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_hard_maximum_cuts_a_polled_task() {
    let (client, router, _log) = start().await;
    let svc = ServiceBuilder::new().layer(idle_limit()).service(client);
    let begun = Instant::now();

    let err = svc
        .oneshot(call("task", json!({"work": 1000})))
        .await
        .expect_err("the hard maximum");

    assert_eq!(begun.elapsed(), secs(60));
    assert!(err.message().contains("attempt exceeded 60s"), "{err}");
    assert!(router.is_empty());
}

/// The server asks to be polled every 30 s: polls alone leave 10 s idle gaps.
#[tokio::test(start_paused = true)]
async fn a_slowly_polled_task_is_cut_at_the_idle_limit_when_the_server_says_nothing() {
    let (client, router, _log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(120)).idle(secs(10)))
        .service(client);
    let begun = Instant::now();

    let err = svc
        .oneshot(call("task", json!({"work": 45, "hint_ms": 30_000})))
        .await
        .expect_err("no progress for 10 s");

    assert_eq!(begun.elapsed(), secs(10));
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn task_status_notifications_keep_a_slowly_polled_task_alive() {
    let (client, router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(TimeoutLayer::new(secs(120)).idle(secs(10)))
        .service(client);
    let begun = Instant::now();

    let res = svc
        .oneshot(call(
            "task",
            json!({"work": 58, "hint_ms": 30_000, "status_every": 5}),
        ))
        .await
        .expect("status notifications are heartbeats");

    // Polled at 30 s (working) and 60 s (completed).
    assert_eq!(begun.elapsed(), secs(60));
    assert_eq!(log.polls.load(Ordering::SeqCst), 2);
    let statuses = u64::from(log.statuses.load(Ordering::SeqCst));
    assert_eq!(statuses, 11, "at 5, 10, ..., 55 s");
    assert_eq!(res.provenance.progress_reports, statuses + 1);
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn progress_for_the_calls_token_keeps_counting_while_its_task_runs() {
    let (client, router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(TimeoutLayer::new(secs(120)).idle(secs(10)))
        .service(client);

    let res = svc
        .oneshot(call(
            "task",
            json!({"work": 58, "hint_ms": 30_000, "progress_every": 5}),
        ))
        .await
        .expect("the call's progress token stays valid for its task");

    let sent = u64::from(log.sent.load(Ordering::SeqCst));
    assert_eq!(sent, 11, "at 5, 10, ..., 55 s");
    // The reports, plus the working poll at 30 s.
    assert_eq!(res.provenance.progress_reports, sent + 1);
    assert!(router.is_empty());
}

// A handler of one's own.

/// A user's handler: counts the progress notifications it sees.
#[derive(Clone, Default)]
struct MyHandler {
    progress: Arc<AtomicU32>,
}

impl ClientHandler for MyHandler {
    async fn on_progress(
        &self,
        _params: ProgressNotificationParam,
        _cx: NotificationContext<RoleClient>,
    ) {
        self.progress.fetch_add(1, Ordering::SeqCst);
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        McpClientService::client_config()
    }
}

#[tokio::test(start_paused = true)]
async fn with_progress_routes_for_a_handler_of_ones_own_and_still_calls_it() {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let log = spawn_server(server_io);
    let mine = MyHandler::default();
    let handler = WithProgress::new(mine.clone());
    let router = handler.router().clone();
    let client = handler.serve(client_io).await.expect("client connects");
    let svc = ServiceBuilder::new()
        .layer(idle_limit())
        .service(McpClientService::new(client).with_progress_router(router.clone()));
    let (req, reports) = counted(call("report", json!({"every": 5, "count": 4, "tail": 1})));

    svc.oneshot(req).await.expect("kept alive by its reports");
    settle().await;

    assert_eq!(log.sent.load(Ordering::SeqCst), 4);
    assert_eq!(reports.load(Ordering::SeqCst), 4);
    assert_eq!(
        mine.progress.load(Ordering::SeqCst),
        4,
        "the wrapped handler sees them too"
    );
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn without_a_router_the_servers_progress_does_not_reach_the_call() {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let _log = spawn_server(server_io);
    let client = McpClientService::client_config()
        .serve(client_io)
        .await
        .expect("client connects");
    let svc = ServiceBuilder::new()
        .layer(idle_limit())
        .service(McpClientService::new(client));
    let begun = Instant::now();

    let err = svc
        .oneshot(call("report", json!({"every": 5, "count": 6, "tail": 1})))
        .await
        .expect_err("nothing routes the reports");

    assert_eq!(begun.elapsed(), secs(10));
    assert_eq!(err.kind(), ErrorKind::Timeout);
}
