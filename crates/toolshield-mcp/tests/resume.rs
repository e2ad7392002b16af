//! A duplicate that takes over the idempotency claim of a process that died while it
//! followed an MCP task resumes that task (`tasks/get`) instead of calling the tool again.
//!
//! The crash is a forgotten future (`std::mem::forget`): nothing of it runs again, no
//! drop guard fires (no `tasks/cancel`, no release, no `OUTCOME_UNKNOWN` record), and its
//! lease stops being renewed, as when the process dies.

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, DetailedTask, GetTaskParams, GetTaskResult, ServerCapabilities, ServerConfig,
    Task, TaskPayload, TaskStatus,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{json, Value};
use tokio::time::advance;
use toolshield::idempotency::{
    storage_key, ClaimOutcome, IdempotencyConfig, IdempotencyHandle, IdempotencyLayer,
    IdempotencyRecord, IdempotencyStore, InMemoryIdempotencyStore, PendingClaim, RecordStatus,
    StoreFuture,
};
use toolshield::prelude::*;
use toolshield_mcp::{McpClientService, RELATED_TASK_META};
use tower::{Layer as _, ServiceExt as _};

const STAMP: &str = "2026-01-01T00:00:00Z";
const LEASE: Duration = Duration::from_secs(30);

/// What the server saw.
#[derive(Default)]
struct Log {
    /// `tools/call` requests.
    calls: AtomicU32,
    /// `tasks/get` requests, per task id.
    polls: Mutex<HashMap<String, u32>>,
    /// Task ids of every `tasks/cancel`.
    cancels: Mutex<Vec<String>>,
    /// Once set, every task completes at its next poll.
    finish: AtomicBool,
}

impl Log {
    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    fn polls_of(&self, task: &str) -> u32 {
        self.polls.lock().unwrap().get(task).copied().unwrap_or(0)
    }
}

/// `charge` answers with a task (`task-0`, `task-1`, ...) that works until the test lets it
/// finish; the server knows only the tasks it created.
#[derive(Clone, Default)]
struct TaskServer {
    log: Arc<Log>,
}

fn task(id: &str) -> Task {
    Task::new(id, TaskStatus::Working, STAMP, STAMP).with_poll_interval_ms(100)
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
        if &*req.name != "charge" {
            return Err(ErrorData::invalid_params("tool not found", None));
        }
        let n = self.log.calls.fetch_add(1, Ordering::SeqCst);
        let id = format!("task-{n}");
        self.log.polls.lock().unwrap().insert(id.clone(), 0);
        Ok(CallToolResponse::Task(CreateTaskResult::new(task(&id))))
    }

    async fn get_task(
        &self,
        req: GetTaskParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        {
            let mut polls = self.log.polls.lock().unwrap();
            let Some(n) = polls.get_mut(&req.task_id) else {
                return Err(ErrorData::invalid_params("unknown task", None));
            };
            *n += 1;
        }
        let payload = if self.log.finish.load(Ordering::SeqCst) {
            let result = CallToolResult::success(vec![ContentBlock::text(format!(
                "charged by {}",
                req.task_id
            ))]);
            match serde_json::to_value(result) {
                Ok(Value::Object(result)) => TaskPayload::Completed { result },
                _ => unreachable!("a tool result is an object"),
            }
        } else {
            TaskPayload::Working
        };
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
        Ok(())
    }
}

async fn start() -> (McpClientService, Arc<Log>) {
    let server = TaskServer::default();
    let log = server.log.clone();
    let client = common::connect_to(server).await;
    (client, log)
}

fn charge() -> ToolRequest {
    ToolRequest::new("charge", json!({"amount": 42}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-1")
}

fn key() -> String {
    storage_key("charge", None, "order-1")
}

fn layer_over<S: IdempotencyStore>(store: Arc<S>) -> (IdempotencyLayer, IdempotencyHandle) {
    let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), store).expect("valid");
    let handle = layer.handle();
    (layer, handle)
}

/// Runs `call` until `ready` holds (checked every 10 ms of the paused clock), then
/// "crashes" it: the future is forgotten, so nothing of it ever runs again.
async fn crash_when<F, C, R>(call: F, ready: C)
where
    F: Future,
    C: Fn() -> R,
    R: Future<Output = bool>,
{
    let mut call = Box::pin(call);
    for _ in 0..500 {
        tokio::select! {
            biased;
            _ = &mut call => panic!("the first call never ends on its own"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        if ready().await {
            // The crash itself: no drop guard of the call may run.
            #[allow(clippy::mem_forget)]
            std::mem::forget(call);
            return;
        }
    }
    panic!("the first call never got where it should crash");
}

/// `fut`, or a panic if it hangs (an hour of the paused clock passes in no time).
async fn bounded<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3600), fut)
        .await
        .expect("the call must end")
}

fn task_id_of(res: &ToolResponse) -> &Value {
    &res.output["_meta"][RELATED_TASK_META]["taskId"]
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_after_a_crash_resumes_the_task_instead_of_calling_the_tool_again() {
    let (client, log) = start().await;
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let (layer, handle) = layer_over(store.clone());

    // Call 1 gets a task, records its id on the claim, polls it once, and dies.
    crash_when(layer.layer(client.clone()).oneshot(charge()), || async {
        let marked = matches!(
            store.get(&key()).await,
            Ok(Some(rec)) if rec.status == RecordStatus::Pending
                && rec.resume.as_deref() == Some("task-0")
        );
        marked && log.polls_of("task-0") >= 1
    })
    .await;
    assert_eq!(log.calls(), 1);

    // The lease runs out; the task finishes on the server meanwhile.
    advance(LEASE + LEASE / 2).await;
    log.finish.store(true, Ordering::SeqCst);
    let polls_before = log.polls_of("task-0");

    let res = bounded(layer.layer(client.clone()).oneshot(charge()))
        .await
        .expect("the duplicate resumes the task to its result");

    assert_eq!(res.output["content"][0]["text"], "charged by task-0");
    assert_eq!(task_id_of(&res), "task-0", "the same task");
    assert!(!res.provenance.replayed, "a result, not a replay");
    assert_eq!(log.calls(), 1, "the tool is not called again");
    assert!(
        log.polls_of("task-0") > polls_before,
        "the taker polled the task"
    );
    assert_eq!(handle.counts().takeovers, 1);
    assert!(log.cancels.lock().unwrap().is_empty(), "nothing cancelled");
    let rec = store.get(&key()).await.unwrap().expect("the outcome");
    assert_eq!(rec.status, RecordStatus::Completed);
    assert_eq!(rec.resume, None);

    // A third call is a plain replay of that result.
    let again = bounded(layer.layer(client.clone()).oneshot(charge()))
        .await
        .expect("replay");
    assert!(again.provenance.replayed);
    assert_eq!(again.output["content"][0]["text"], "charged by task-0");
    assert_eq!(log.calls(), 1);
}

/// A store that keeps no resume tokens: every operation but `mark_resume` (left to the
/// trait's default, which refuses) goes to an in-memory store.
struct NoResume(InMemoryIdempotencyStore);

impl IdempotencyStore for NoResume {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        record: IdempotencyRecord,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        self.0.claim(key, record, lease)
    }
    fn claim_pending<'a>(
        &'a self,
        key: &'a str,
        claim: PendingClaim<'a>,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        self.0.claim_pending(key, claim, lease)
    }
    fn finish<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        self.0.finish(key, owner, record, ttl)
    }
    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        self.0.renew(key, owner, lease)
    }
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
        self.0.release(key, owner)
    }
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<IdempotencyRecord>> {
        self.0.get(key)
    }
    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        self.0.remove(key)
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_recorded_task_a_takeover_calls_the_tool_again() {
    let (client, log) = start().await;
    let store = Arc::new(NoResume(InMemoryIdempotencyStore::new()));
    let (layer, handle) = layer_over(store.clone());

    // The task id cannot be recorded: the call polls on all the same, then dies.
    crash_when(layer.layer(client.clone()).oneshot(charge()), || async {
        log.polls_of("task-0") >= 2
    })
    .await;
    let rec = store.get(&key()).await.unwrap().expect("the claim is left");
    assert_eq!(rec.resume, None);

    advance(LEASE + LEASE / 2).await;
    log.finish.store(true, Ordering::SeqCst);
    let res = bounded(layer.layer(client.clone()).oneshot(charge()))
        .await
        .expect("runs again");

    assert_eq!(log.calls(), 2, "nothing to resume: the tool runs again");
    assert_eq!(task_id_of(&res), "task-1", "a second task");
    assert_eq!(handle.counts().takeovers, 1);
}

#[tokio::test(start_paused = true)]
async fn a_task_the_server_no_longer_knows_is_outcome_unknown_and_never_run_again() {
    let (client, log) = start().await;
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let (layer, handle) = layer_over(store.clone());
    // What a process that died after recording its task leaves, written by hand: the task
    // is one this server never created (it restarted, or the task expired).
    let digest = charge().payload_digest().expect("digest");
    let pending = PendingClaim {
        payload_hash: digest,
        owner: "dead-owner",
    };
    assert_eq!(
        store.claim_pending(&key(), pending, LEASE).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(store
        .mark_resume(&key(), "dead-owner", "task-gone", LEASE)
        .await
        .unwrap());
    advance(LEASE + LEASE / 2).await;

    let err = bounded(layer.layer(client.clone()).oneshot(charge()))
        .await
        .expect_err("the task cannot be resumed");

    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert!(!err.kind().is_retriable());
    assert!(err.to_string().contains("could not be resumed"), "{err}");
    assert!(err.to_string().contains("task-gone"), "{err}");
    assert_eq!(log.calls(), 0, "the tool is never called");
    assert_eq!(handle.counts().takeovers, 1);
    let rec = store.get(&key()).await.unwrap().expect("kept");
    assert_eq!(rec.status, RecordStatus::Failed, "kept for reconciliation");

    let again = bounded(layer.layer(client.clone()).oneshot(charge()))
        .await
        .expect_err("replayed");
    assert_eq!(again.kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(log.calls(), 0, "still never called");
}

#[tokio::test(start_paused = true)]
async fn a_call_without_idempotency_starts_its_task_as_before() {
    let (client, log) = start().await;
    log.finish.store(true, Ordering::SeqCst);

    let res = bounded(client.clone().oneshot(charge()))
        .await
        .expect("completes");

    assert_eq!(task_id_of(&res), "task-0");
    assert_eq!(log.calls(), 1);
}
