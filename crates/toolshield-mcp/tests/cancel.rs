//! Cancellation reaches the MCP server: `notifications/cancelled`, exactly once, when a
//! call is cancelled, times out or is dropped; never after an answer.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, RequestId,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolshield::prelude::*;
use toolshield::timeout::TimeoutLayer;
use toolshield_mcp::{McpClientService, REASON_ABANDONED, REASON_CANCELLED};
use tower::{Layer as _, ServiceExt as _};

/// What the server saw.
#[derive(Default)]
struct Log {
    /// `(request id, reason)` of every `notifications/cancelled` received.
    notices: Mutex<Vec<(Option<RequestId>, Option<String>)>>,
    /// Request ids of the `slow` calls that started.
    started: Mutex<Vec<RequestId>>,
    /// Request ids of the `slow` calls whose handler saw its cancellation token fire.
    observed: Mutex<Vec<RequestId>>,
    /// Woken on every change above.
    changed: Notify,
}

impl Log {
    fn notices(&self) -> Vec<(Option<RequestId>, Option<String>)> {
        self.notices.lock().unwrap().clone()
    }

    /// Waits (at most 10 s of the test's clock) until `done` holds.
    async fn until(&self, what: &str, done: impl Fn(&Log) -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
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

/// - `slow`: runs until its request is cancelled, and records that it saw the cancellation;
/// - `fast`: answers at once;
/// - `fail`: answers with a JSON-RPC error;
/// - `broken`: answers with an `isError: true` result.
#[derive(Clone, Default)]
struct Recorder {
    log: Arc<Log>,
}

impl ServerHandler for Recorder {
    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match &*req.name {
            "slow" => {
                self.log.started.lock().unwrap().push(cx.id.clone());
                self.log.changed.notify_waiters();
                cx.ct.cancelled().await;
                self.log.observed.lock().unwrap().push(cx.id.clone());
                self.log.changed.notify_waiters();
                Err(ErrorData::internal_error("cancelled", None))
            }
            "fast" => Ok(CallToolResult::success(vec![ContentBlock::text("done")]).into()),
            "fail" => Err(ErrorData::internal_error("disk on fire", None)),
            "broken" => Ok(CallToolResult::error(vec![ContentBlock::text("no")]).into()),
            _ => Err(ErrorData::invalid_params("tool not found", None)),
        }
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _cx: NotificationContext<RoleServer>,
    ) {
        self.log
            .notices
            .lock()
            .unwrap()
            .push((notification.request_id, notification.reason));
        self.log.changed.notify_waiters();
    }
}

async fn start() -> (McpClientService, Arc<Log>) {
    let server = Recorder::default();
    let log = server.log.clone();
    let client = common::connect_to(server).await;
    (client, log)
}

fn read(tool: &str) -> ToolRequest {
    ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly)
}

/// A full round trip after the notice: a second notice sent with the first would have
/// arrived by then (one connection, one ordered stream).
async fn settle(client: &McpClientService) {
    let res = client
        .clone()
        .oneshot(read("fast"))
        .await
        .expect("fast answers");
    assert_eq!(res.output["content"][0]["text"], "done");
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// The one notice the server got names the one `slow` call and gives `reason`; the
/// handler saw its cancellation token fire.
fn assert_one_notice(log: &Log, reason: &str) {
    let started = log.started.lock().unwrap().clone();
    assert_eq!(started.len(), 1, "one slow call started");
    let notices = log.notices();
    assert_eq!(
        notices,
        vec![(Some(started[0].clone()), Some(reason.to_owned()))],
        "exactly one notice, for the slow call"
    );
    assert_eq!(
        *log.observed.lock().unwrap(),
        started,
        "the handler saw its cancellation"
    );
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_sends_one_notice_and_the_tool_sees_it() {
    let (client, log) = start().await;
    let svc = TimeoutLayer::new(Duration::from_secs(2)).layer(client.clone());

    let begun = tokio::time::Instant::now();
    let err = svc.oneshot(read("slow")).await.expect_err("times out");

    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(begun.elapsed(), Duration::from_secs(2));
    log.until("the cancellation", |l| {
        !l.observed.lock().unwrap().is_empty()
    })
    .await;
    settle(&client).await;
    assert_one_notice(&log, REASON_ABANDONED);
}

#[tokio::test(start_paused = true)]
async fn caller_cancel_sends_one_notice_with_the_cancel_reason() {
    let (client, log) = start().await;
    let token = CancellationToken::new();
    let call = tokio::spawn(
        client
            .clone()
            .oneshot(read("slow").cancel_token(token.clone())),
    );
    log.until("the call", |l| !l.started.lock().unwrap().is_empty())
        .await;

    token.cancel();
    let err = call.await.unwrap().expect_err("cancelled");

    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    log.until("the cancellation", |l| {
        !l.observed.lock().unwrap().is_empty()
    })
    .await;
    settle(&client).await;
    assert_one_notice(&log, REASON_CANCELLED);
}

#[tokio::test(start_paused = true)]
async fn dropped_future_sends_one_notice() {
    let (client, log) = start().await;
    let call = client.clone().oneshot(read("slow"));
    tokio::select! {
        _ = call => panic!("the slow call never answers before it is cancelled"),
        () = log.until("the call", |l| !l.started.lock().unwrap().is_empty()) => {}
    }
    // The `select!` dropped the call's future.

    log.until("the cancellation", |l| {
        !l.observed.lock().unwrap().is_empty()
    })
    .await;
    settle(&client).await;
    assert_one_notice(&log, REASON_ABANDONED);
}

#[tokio::test(start_paused = true)]
async fn timeout_through_the_full_stack_sends_one_notice_per_attempt() {
    let (client, log) = start().await;
    let shield = Shield::from_config(
        ShieldConfig::from_toml_str(
            r#"
[defaults]
kind = "read_only"
timeout = { attempt = "1s", soft = "500ms" }
retry = { max_attempts = 2, backoff = { strategy = "none" } }
"#,
        )
        .expect("valid config"),
    )
    .expect("valid shield");
    let svc = shield.wrap("slow", client.clone());

    let err = svc.oneshot(read("slow")).await.expect_err("times out");

    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    log.until("both cancellations", |l| {
        l.observed.lock().unwrap().len() == 2
    })
    .await;
    settle(&client).await;
    let started = log.started.lock().unwrap().clone();
    assert_eq!(started.len(), 2, "two attempts");
    let mut notices = log.notices();
    notices.sort_by_key(|(id, _)| id.as_ref().map(ToString::to_string));
    let mut want: Vec<_> = started
        .iter()
        .map(|id| (Some(id.clone()), Some(REASON_ABANDONED.to_owned())))
        .collect();
    want.sort_by_key(|(id, _)| id.as_ref().map(ToString::to_string));
    assert_eq!(notices, want, "one notice per abandoned attempt");
}

#[tokio::test(start_paused = true)]
async fn success_sends_no_notice() {
    let (client, log) = start().await;
    for _ in 0..3 {
        let res = client.clone().oneshot(read("fast")).await.expect("answers");
        assert_eq!(res.output["content"][0]["text"], "done");
    }
    settle(&client).await;
    assert!(log.notices().is_empty(), "{:?}", log.notices());
}

#[tokio::test(start_paused = true)]
async fn error_answers_send_no_notice() {
    let (client, log) = start().await;
    let err = client
        .clone()
        .oneshot(read("fail"))
        .await
        .expect_err("a JSON-RPC error");
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed, "{err}");
    let res = client
        .clone()
        .oneshot(read("broken"))
        .await
        .expect("an isError result is kept");
    assert!(res.is_error());
    let err = client
        .clone()
        .oneshot(read("missing"))
        .await
        .expect_err("unknown tool");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    settle(&client).await;
    assert!(log.notices().is_empty(), "{:?}", log.notices());
}

#[tokio::test(start_paused = true)]
async fn a_call_cancelled_before_it_is_sent_sends_nothing() {
    let (client, log) = start().await;
    let token = CancellationToken::new();
    token.cancel();

    let err = client
        .clone()
        .oneshot(read("slow").cancel_token(token))
        .await
        .expect_err("cancelled");

    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    settle(&client).await;
    assert!(log.started.lock().unwrap().is_empty(), "never sent");
    assert!(log.notices().is_empty(), "{:?}", log.notices());
}

#[tokio::test(start_paused = true)]
async fn a_late_cancel_after_the_answer_sends_nothing() {
    let (client, log) = start().await;
    let token = CancellationToken::new();
    let res = client
        .clone()
        .oneshot(read("fast").cancel_token(token.clone()))
        .await
        .expect("answers");
    assert_eq!(res.output["content"][0]["text"], "done");
    token.cancel();

    settle(&client).await;
    assert!(log.notices().is_empty(), "{:?}", log.notices());
}

/// A mutation cancelled by its caller after it was sent may have run on the server: the
/// caller gets its `CANCELLED`, and the idempotency layer keeps the key as
/// `OUTCOME_UNKNOWN`, so a repeat with that key is never sent again.
#[tokio::test(start_paused = true)]
async fn a_mutation_cancelled_after_it_was_sent_keeps_its_key() {
    let (client, log) = start().await;
    let layer = toolshield::idempotency::IdempotencyLayer::new(
        toolshield::idempotency::IdempotencyConfig::default(),
    )
    .expect("idempotency layer");
    let svc = layer.layer(client.clone());
    let mutation = |token: &CancellationToken| {
        ToolRequest::new("slow", json!({"amount": 5}))
            .kind(CallKind::Mutating)
            .idempotency_key("pay-1")
            .cancel_token(token.clone())
    };
    let token = CancellationToken::new();
    let call = tokio::spawn(svc.clone().oneshot(mutation(&token)));
    log.until("the call", |l| !l.started.lock().unwrap().is_empty())
        .await;
    token.cancel();
    let err = call.await.unwrap().expect_err("cancelled after sending");
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    log.until("the cancellation", |l| {
        !l.observed.lock().unwrap().is_empty()
    })
    .await;
    settle(&client).await;
    assert_one_notice(&log, REASON_CANCELLED);

    // The same key again: answered from the record, never sent (were it sent, `slow`
    // would run until the bound below).
    let again = tokio::time::timeout(
        Duration::from_secs(30),
        svc.clone().oneshot(mutation(&CancellationToken::new())),
    )
    .await
    .expect("answered from the record, not sent again")
    .expect_err("the outcome is unknown");
    assert_eq!(again.kind(), ErrorKind::OutcomeUnknown, "{again}");
    assert_eq!(log.started.lock().unwrap().len(), 1, "sent once");
}

/// The answer is already in when the caller's token fires: the call returns the answer
/// (the tool ran, and a mutation's result is not lost to an unknown outcome), and the
/// server is not told to cancel a request it has finished.
#[tokio::test(start_paused = true)]
async fn an_answer_that_arrived_before_the_cancel_is_returned_and_no_notice_is_sent() {
    let (client, log) = start().await;
    let token = CancellationToken::new();
    let mut call = std::pin::pin!(client
        .clone()
        .oneshot(read("fast").cancel_token(token.clone())));
    // One poll sends the request; the call then waits for its answer.
    let first = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(call.as_mut(), cx))
    })
    .await;
    assert!(
        first.is_pending(),
        "the answer cannot be in before the request left"
    );
    // The paused clock moves only once every task is idle: by then the server has answered
    // and the client's loop has handed the answer to the call, which has not seen it yet.
    tokio::time::sleep(Duration::from_millis(10)).await;
    token.cancel();

    let res = call.await.expect("the answer that was already in");
    assert_eq!(res.output["content"][0]["text"], "done");
    settle(&client).await;
    assert!(log.notices().is_empty(), "{:?}", log.notices());
}
