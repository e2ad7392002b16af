//! Long-running MCP tools, against the MCP specification (2025-06-18 and 2025-11-25:
//! `notifications/cancelled`, `progressToken` and `notifications/progress`) and
//! docs/progress.md, docs/mcp.md:
//!
//! - every way toolshield cuts a call (idle limit, hard maximum, whole-call deadline, the
//!   caller's token, the caller dropping the future) tells the server once, with the
//!   request id it sent, and the server's handler sees it; a call that ended on its own
//!   tells nothing, and a cancel after the answer is ignored;
//! - the server's progress keeps a call alive whatever values it carries (the spec asks
//!   senders for increasing values; a receiver cannot rely on it), never past the hard
//!   maximum; a flood is absorbed; a report for a finished call's token reaches no other
//!   call; a message of any size or shape reaches provenance on one bounded line;
//! - a server that answers twice, late, or with an id that is not the request's hands no
//!   call another call's answer;
//! - a mutating tool cut by its idle limit is not sent again.
//!
//! A real rmcp server runs in-process over `tokio::io::duplex` (or a server written by
//! hand on the wire, for answers rmcp would never send), on tokio's paused clock: the
//! in-memory transport needs no real time.

mod common;

use common::{arg_u64, done};

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotificationParam, ProgressNotificationParam,
    RequestId,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, WriteHalf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield::prelude::*;
use toolshield::provenance::ProvenanceLayer;
use toolshield::timeout::{DeadlineLayer, TimeoutLayer};
use toolshield_mcp::{McpClientService, ProgressRouter, REASON_ABANDONED, REASON_CANCELLED};
use tower::{ServiceBuilder, ServiceExt as _};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// What the server saw and did.
#[derive(Default)]
struct Log {
    /// Request ids of the `tools/call`s that started, in order.
    started: Mutex<Vec<RequestId>>,
    /// Request ids whose handler saw its cancellation token fire.
    observed: Mutex<Vec<RequestId>>,
    /// `(request id, reason)` of every `notifications/cancelled`.
    notices: Mutex<Vec<(Option<RequestId>, Option<String>)>>,
    /// Progress notifications sent.
    sent: AtomicU32,
    changed: Notify,
}

impl Log {
    fn started(&self) -> Vec<RequestId> {
        self.started.lock().unwrap().clone()
    }

    fn notices(&self) -> Vec<(Option<RequestId>, Option<String>)> {
        self.notices.lock().unwrap().clone()
    }

    fn bump(&self) {
        self.changed.notify_waiters();
    }

    /// Waits (at most 600 s of the paused clock) until `done` holds.
    async fn until(&self, what: &str, done: impl Fn(&Log) -> bool) {
        common::until(&self.changed, what, || done(self)).await;
    }
}

/// - `slow`: silent until its request is cancelled;
/// - `fast`: answers at once;
/// - `report {every_ms, values, total, message, tail_ms}`: one progress notification per
///   value (with the call's token, `every_ms` apart, with `total` and `message` when
///   given), then answers `tail_ms` later; stops when cancelled;
/// - `flood {n}`: `n` notifications back to back, then answers;
/// - `late {after_ms}`: answers at once, then reports on the finished call's token
///   `after_ms` later.
#[derive(Clone, Default)]
struct LongServer {
    log: Arc<Log>,
}

impl LongServer {
    async fn notify(&self, cx: &RequestContext<RoleServer>, param: ProgressNotificationParam) {
        let _ = cx.peer.notify_progress(param).await;
        self.log.sent.fetch_add(1, Ordering::SeqCst);
        self.log.bump();
    }
}

impl ServerHandler for LongServer {
    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::from(req.arguments.clone().unwrap_or_default());
        let token = cx.meta.get_progress_token();
        self.log.started.lock().unwrap().push(cx.id.clone());
        self.log.bump();
        let work = async {
            match &*req.name {
                "fast" => Ok(done()),
                "report" => {
                    let token = token.expect("the client sends a progress token");
                    let values = args["values"].as_array().cloned().unwrap_or_default();
                    for value in values {
                        tokio::time::sleep(ms(arg_u64(&args, "every_ms"))).await;
                        let mut param =
                            ProgressNotificationParam::new(token.clone(), value.as_f64().unwrap());
                        if let Some(total) = args.get("total").and_then(Value::as_f64) {
                            param = param.with_total(total);
                        }
                        if let Some(message) = args.get("message").and_then(Value::as_str) {
                            param = param.with_message(message.to_owned());
                        }
                        self.notify(&cx, param).await;
                    }
                    tokio::time::sleep(ms(arg_u64(&args, "tail_ms"))).await;
                    Ok(done())
                }
                "flood" => {
                    let token = token.expect("the client sends a progress token");
                    for n in 0..arg_u64(&args, "n") {
                        self.notify(&cx, ProgressNotificationParam::new(token.clone(), n as f64))
                            .await;
                    }
                    Ok(done())
                }
                "late" => {
                    let token = token.expect("the client sends a progress token");
                    let (this, peer) = (self.clone(), cx.peer.clone());
                    let after = ms(arg_u64(&args, "after_ms"));
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let _ = peer
                            .notify_progress(
                                ProgressNotificationParam::new(token, 99.0)
                                    .with_message("for a finished call".to_owned()),
                            )
                            .await;
                        this.log.sent.fetch_add(1, Ordering::SeqCst);
                        this.log.bump();
                    });
                    Ok(done())
                }
                // `slow`, and anything else: silent until cancelled.
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            res = work => res,
            () = cx.ct.cancelled() => {
                self.log.observed.lock().unwrap().push(cx.id.clone());
                self.log.bump();
                Err(ErrorData::internal_error("cancelled", None))
            }
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
        self.log.bump();
    }
}

async fn start() -> (McpClientService, ProgressRouter, Arc<Log>) {
    let server = LongServer::default();
    let log = server.log.clone();
    let client = common::connect_to(server).await;
    let router = client
        .progress_router()
        .expect("connect routes progress")
        .clone();
    (client, router, log)
}

fn read(tool: &str, args: Value) -> ToolRequest {
    ToolRequest::new(tool, args).kind(CallKind::ReadOnly)
}

/// A full round trip on the same connection: anything the client sent before it (a
/// second notice, say) has reached the server's handler by then.
async fn settle(client: &McpClientService) {
    let res = client
        .clone()
        .oneshot(read("fast", json!({})))
        .await
        .expect("fast answers");
    assert_eq!(res.output["content"][0]["text"], "done");
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Exactly one notice, for the one call that was cut (the first `tools/call` the server
/// saw), with `reason`; and its handler saw its cancellation token fire.
async fn assert_told_once(client: &McpClientService, log: &Log, reason: &str) {
    log.until("the cancellation", |l| {
        !l.observed.lock().unwrap().is_empty()
    })
    .await;
    let cut = log.started()[0].clone();
    settle(client).await;
    assert_eq!(
        log.notices(),
        vec![(Some(cut.clone()), Some(reason.to_owned()))],
        "exactly one notice, for the cut call's request id"
    );
    assert_eq!(*log.observed.lock().unwrap(), vec![cut]);
}

// Cancellation reaches the server.

#[tokio::test(start_paused = true)]
async fn an_idle_limit_cut_tells_the_server_once_with_the_request_id() {
    let (client, router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());
    let begun = Instant::now();

    // Two reports 4 s apart, then silence.
    let err = svc
        .oneshot(read(
            "report",
            json!({"every_ms": 4000, "values": [1, 2], "tail_ms": 1_000_000}),
        ))
        .await
        .expect_err("cut 10 s after the last report");

    assert_eq!(begun.elapsed(), secs(18));
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert!(router.is_empty());
    assert_told_once(&client, &log, REASON_ABANDONED).await;
}

#[tokio::test(start_paused = true)]
async fn the_hard_maximum_cut_of_a_reporting_call_tells_the_server_once() {
    let (client, _router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(20)).idle(secs(10)))
        .service(client.clone());
    let values: Vec<u64> = (1..=1000).collect();
    let begun = Instant::now();

    let err = svc
        .oneshot(read("report", json!({"every_ms": 3000, "values": values})))
        .await
        .expect_err("the hard maximum");

    assert_eq!(begun.elapsed(), secs(20));
    assert!(err.message().contains("attempt exceeded 20s"), "{err}");
    assert_told_once(&client, &log, REASON_ABANDONED).await;
}

#[tokio::test(start_paused = true)]
async fn a_whole_call_deadline_cut_tells_the_server_once() {
    let (client, _router, log) = start().await;
    // The whole-call budget alone, no attempt timeout below it.
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(secs(5)))
        .service(client.clone());
    let begun = Instant::now();

    let err = svc
        .oneshot(read("slow", json!({})))
        .await
        .expect_err("the deadline");

    assert_eq!(begun.elapsed(), secs(5));
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_told_once(&client, &log, REASON_ABANDONED).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_before_the_idle_limit_cuts_the_call_and_tells_the_server_once() {
    let (client, _router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());
    let begun = Instant::now();

    let err = svc
        .oneshot(read("slow", json!({})).deadline(begun + secs(3)))
        .await
        .expect_err("the request's deadline");

    assert_eq!(begun.elapsed(), secs(3));
    assert!(err.message().contains("deadline"), "{err}");
    assert_told_once(&client, &log, REASON_ABANDONED).await;
}

#[tokio::test(start_paused = true)]
async fn a_caller_cancel_during_progress_tells_the_server_once_with_the_cancel_reason() {
    let (client, router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());
    let values: Vec<u64> = (1..=1000).collect();
    let req = read("report", json!({"every_ms": 1000, "values": values}));
    let token = req.call_token().clone();
    let call = tokio::spawn(svc.oneshot(req));
    log.until("three reports", |l| l.sent.load(Ordering::SeqCst) >= 3)
        .await;

    token.cancel();
    let err = call.await.unwrap().expect_err("cancelled");

    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert!(router.is_empty());
    assert_told_once(&client, &log, REASON_CANCELLED).await;
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropping_a_reporting_call_tells_the_server_once() {
    let (client, router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());
    let values: Vec<u64> = (1..=1000).collect();
    let mut call =
        Box::pin(svc.oneshot(read("report", json!({"every_ms": 1000, "values": values}))));
    tokio::select! {
        r = &mut call => panic!("the call ended: {r:?}"),
        () = log.until("two reports", |l| l.sent.load(Ordering::SeqCst) >= 2) => {}
    }

    drop(call);

    assert!(router.is_empty());
    assert_told_once(&client, &log, REASON_ABANDONED).await;
}

#[tokio::test(start_paused = true)]
async fn a_reporting_call_that_completes_tells_nothing_and_a_later_cancel_is_ignored() {
    let (client, router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());
    let req = read(
        "report",
        json!({"every_ms": 5000, "values": [1, 2, 3], "tail_ms": 1000}),
    );
    let token = req.call_token().clone();

    let res = svc.oneshot(req).await.expect("kept alive by its reports");
    token.cancel();
    settle(&client).await;

    assert_eq!(res.output["content"][0]["text"], "done");
    assert!(log.notices().is_empty(), "{:?}", log.notices());
    assert!(log.observed.lock().unwrap().is_empty());
    assert!(router.is_empty());
}

// Progress, whatever the server sends.

/// `(progress, total)` of every report that reached the caller's callback.
type Values = Arc<Mutex<Vec<(Option<f64>, Option<f64>)>>>;

/// Collects the values reaching the caller's callback.
fn collected(req: ToolRequest) -> (ToolRequest, Values) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let req = req.on_progress(move |e| sink.lock().unwrap().push((e.progress, e.total)));
    (req, seen)
}

#[tokio::test(start_paused = true)]
async fn progress_that_does_not_increase_still_resets_the_idle_limit_but_never_the_maximum() {
    // The spec asks the sender for increasing values; docs/progress.md makes every report
    // activity. A server that repeats or goes back is kept alive by its reports, and is
    // cut at the hard maximum all the same.
    let (client, _router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(40)).idle(secs(10)))
        .service(client.clone());
    let values = [5, 5, 5, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let (req, seen) = collected(read("report", json!({"every_ms": 6000, "values": values})));
    let begun = Instant::now();

    let err = svc.oneshot(req).await.expect_err("the hard maximum");

    assert_eq!(begun.elapsed(), secs(40), "reports 6 s apart keep it alive");
    assert!(err.message().contains("attempt exceeded 40s"), "{err}");
    let seen: Vec<f64> = seen.lock().unwrap().iter().filter_map(|v| v.0).collect();
    assert_eq!(seen.len(), 6, "reports at 6, 12, ..., 36 s: {seen:?}");
    assert_told_once(&client, &log, REASON_ABANDONED).await;
}

#[tokio::test(start_paused = true)]
async fn absurd_progress_values_and_totals_reach_the_caller_unchanged_and_break_nothing() {
    let (client, router, _log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());
    for (values, total) in [
        (json!([1e308, -1e308, -0.0]), json!(0.0)),
        (json!([100, 200]), json!(-5)),
        (json!([1.5]), json!(f64::MAX)),
        (json!([f64::MIN_POSITIVE]), Value::Null),
    ] {
        let (req, seen) = collected(read(
            "report",
            json!({"every_ms": 1000, "values": values, "total": total, "tail_ms": 1000}),
        ));
        let res = svc.clone().oneshot(req).await.expect("answers");

        let n = values.as_array().unwrap().len();
        assert_eq!(res.provenance.progress_reports, n as u64);
        let mut got = seen.lock().unwrap().clone();
        got.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        let mut want: Vec<_> = values
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v.as_f64(), total.as_f64()))
            .collect();
        want.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        assert_eq!(got, want);
        assert!(router.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_progress_is_absorbed_and_leaves_nothing_behind() {
    let (client, router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());
    let peak = Arc::new(AtomicU32::new(0));
    let (r, p) = (router.clone(), Arc::clone(&peak));
    let req = read("flood", json!({"n": 20_000})).on_progress(move |_| {
        p.fetch_max(u32::try_from(r.len()).unwrap_or(u32::MAX), Ordering::SeqCst);
    });

    let res = svc.oneshot(req).await.expect("answers");

    assert_eq!(log.sent.load(Ordering::SeqCst), 20_000);
    // Each notification is handled on a task of its own: the last few may land after
    // the answer, and then go nowhere.
    let reports = res.provenance.progress_reports;
    assert!((19_000..=20_000).contains(&reports), "{reports}");
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "one registration, the call's"
    );
    assert!(router.is_empty());
    // The connection still serves calls.
    settle(&client).await;
}

#[tokio::test(start_paused = true)]
async fn a_report_on_a_finished_calls_token_reaches_no_later_call() {
    let (client, router, log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());

    // Answers at once; reports on its own, finished, token 4 s later.
    svc.clone()
        .oneshot(read("late", json!({"after_ms": 4000})))
        .await
        .expect("answers");
    // A silent call in flight when that report arrives.
    let (req, seen) = collected(read("slow", json!({})));
    let begun = Instant::now();
    let err = svc.oneshot(req).await.expect_err("silent: cut");

    assert_eq!(
        log.sent.load(Ordering::SeqCst),
        1,
        "the late report was sent"
    );
    assert_eq!(
        begun.elapsed(),
        secs(10),
        "the late report kept nothing alive"
    );
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert!(seen.lock().unwrap().is_empty());
    assert!(router.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_progress_message_of_any_size_or_shape_reaches_provenance_on_one_bounded_line() {
    let (client, _router, _log) = start().await;
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client);
    let hostile = format!(
        "line one\nline two\r\n\u{2028}\u{2029}\u{1b}[31m\u{0}{}\u{202e}",
        "é".repeat(1 << 19)
    );
    let res = svc
        .oneshot(read(
            "report",
            json!({"every_ms": 1000, "values": [1], "message": hostile}),
        ))
        .await
        .expect("answers");

    let message = res
        .provenance
        .progress_message
        .clone()
        .expect("a message was kept");
    assert!(
        message.len() <= 256 + '…'.len_utf8(),
        "{} bytes",
        message.len()
    );
    assert!(message.starts_with("line one"), "{message:?}");
    assert!(
        !message
            .chars()
            .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202e}')),
        "{message:?}"
    );
    let json = serde_json::to_string(&res.provenance).unwrap();
    assert!(
        json.len() < 4096,
        "provenance stays small: {} bytes",
        json.len()
    );
}

// A server whose answers do not follow the protocol, written by hand on the wire.

async fn send(w: &mut WriteHalf<DuplexStream>, msg: &Value) {
    let mut line = serde_json::to_vec(msg).unwrap();
    line.push(b'\n');
    let _ = w.write_all(&line).await;
}

fn text_result(id: &Value, text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
}

/// What the hand-written server received: `tools/call` ids and cancelled request ids.
#[derive(Default)]
struct Wire {
    calls: Vec<Value>,
    cancelled: Vec<Value>,
}

/// - `twice`: answers, and answers the same id again ("late") when the next message
///   arrives, before answering that one;
/// - `hold`: answers only when the next message arrives, with "late", and then as
///   asked by that message;
/// - `answer_cancelled`: never answers the call itself; on its `notifications/cancelled`
///   answers it with a result and then an error;
/// - `string_id`: first answers the same id as a string (not the id it was sent), then
///   as a number;
/// - anything else: its own name.
async fn wire_server(io: DuplexStream, seen: Arc<Mutex<Wire>>) {
    let (r, mut w) = tokio::io::split(io);
    let mut lines = BufReader::new(r).lines();
    let mut held: Option<Value> = None;
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        if let Some(late) = held.take() {
            send(&mut w, &text_result(&late, "late")).await;
        }
        match msg.get("method").and_then(Value::as_str) {
            Some("initialize") => {
                let version = msg["params"]["protocolVersion"].clone();
                send(
                    &mut w,
                    &json!({"jsonrpc": "2.0", "id": id, "result": {
                        "protocolVersion": version,
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "wire", "version": "1"}
                    }}),
                )
                .await;
            }
            Some("notifications/cancelled") => {
                let cancelled = msg["params"]["requestId"].clone();
                seen.lock().unwrap().cancelled.push(cancelled.clone());
                // Answers the request it was told is cancelled, both ways.
                send(&mut w, &text_result(&cancelled, "after the cancel")).await;
                send(
                    &mut w,
                    &json!({"jsonrpc": "2.0", "id": cancelled, "error": {"code": -32603, "message": "after the cancel"}}),
                )
                .await;
            }
            Some("tools/call") => {
                seen.lock().unwrap().calls.push(id.clone());
                match msg["params"]["name"].as_str().unwrap_or("") {
                    "twice" => {
                        send(&mut w, &text_result(&id, "first")).await;
                        // The second answer goes out when the next call arrives.
                        held = Some(id.clone());
                    }
                    "hold" => held = Some(id.clone()),
                    "answer_cancelled" => {}
                    "string_id" => {
                        send(&mut w, &text_result(&json!(id.to_string()), "as a string")).await;
                        send(&mut w, &text_result(&id, "string_id")).await;
                    }
                    name => send(&mut w, &text_result(&id, name)).await,
                }
            }
            _ => {}
        }
    }
}

async fn wire_client() -> (McpClientService, Arc<Mutex<Wire>>) {
    let seen = Arc::new(Mutex::new(Wire::default()));
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(wire_server(server_io, Arc::clone(&seen)));
    let client = McpClientService::connect(client_io)
        .await
        .expect("client connects");
    (client, seen)
}

async fn text_of_call(client: &McpClientService, tool: &str) -> String {
    let res = tokio::time::timeout(secs(30), client.clone().oneshot(read(tool, json!({}))))
        .await
        .expect("answered")
        .expect("a result");
    res.output["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(start_paused = true)]
async fn a_second_answer_for_one_request_reaches_no_other_call() {
    let (client, _seen) = wire_client().await;
    assert_eq!(text_of_call(&client, "twice").await, "first");
    for tool in ["a", "b", "c"] {
        assert_eq!(text_of_call(&client, tool).await, tool);
    }
}

#[tokio::test(start_paused = true)]
async fn answers_to_a_cancelled_request_reach_no_other_call() {
    let (client, seen) = wire_client().await;
    let token = CancellationToken::new();
    let call = tokio::spawn(
        client
            .clone()
            .oneshot(read("answer_cancelled", json!({})).cancel_token(token.clone())),
    );
    tokio::time::timeout(secs(10), async {
        while seen.lock().unwrap().calls.is_empty() {
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await
    .expect("the call reached the server");

    token.cancel();
    let err = call.await.unwrap().expect_err("cancelled");

    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    // The server answers the cancelled id (a result, then an error) on the notice; the
    // calls after it get their own answers.
    for tool in ["a", "b"] {
        assert_eq!(text_of_call(&client, tool).await, tool);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.cancelled,
        vec![seen.calls[0].clone()],
        "one notice, its id"
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_answer_after_an_idle_cut_reaches_no_other_call() {
    let (client, seen) = wire_client().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(60)).idle(secs(10)))
        .service(client.clone());
    let err = svc
        .oneshot(read("hold", json!({})))
        .await
        .expect_err("silent: cut");
    assert!(err.message().contains("no progress for 10s"), "{err}");

    // The held call is answered ("late") as the notice (or the next call) arrives.
    assert_eq!(text_of_call(&client, "next").await, "next");
    assert_eq!(text_of_call(&client, "after").await, "after");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.cancelled, vec![seen.calls[0].clone()]);
}

#[tokio::test(start_paused = true)]
async fn an_answer_with_the_request_id_written_as_a_string_reaches_only_that_call() {
    // JSON-RPC asks for the request's id as it was sent; rmcp also takes the id written
    // as a string (`"3"` for `3`). Either way, it is that request's answer, and the
    // second answer for the same id reaches no later call.
    let (client, _seen) = wire_client().await;
    let first = text_of_call(&client, "string_id").await;
    assert!(first == "as a string" || first == "string_id", "{first:?}");
    assert_eq!(text_of_call(&client, "plain").await, "plain");
    assert_eq!(text_of_call(&client, "other").await, "other");
}

// A mutating tool cut by its idle limit.

fn shield(kind: &str) -> Shield {
    Shield::from_config(
        ShieldConfig::from_toml_str(&format!(
            r#"
[defaults]
kind = "{kind}"
timeout = {{ attempt = "60s", idle = "10s" }}
retry = {{ max_attempts = 3, backoff = {{ strategy = "none" }} }}
"#
        ))
        .expect("valid config"),
    )
    .expect("valid shield")
}

#[tokio::test(start_paused = true)]
async fn a_mutation_cut_by_its_idle_limit_is_sent_once_and_its_key_answers_outcome_unknown() {
    let (client, _router, log) = start().await;
    let svc = shield("mutating").wrap("slow", client.clone());
    let mutation = || {
        ToolRequest::new("slow", json!({"amount": 5}))
            .kind(CallKind::Mutating)
            .idempotency_key("pay-7")
    };

    let err = svc.clone().oneshot(mutation()).await.expect_err("cut");

    // Under a Shield the idempotency layer turns a mutation's timeout after sending
    // into OUTCOME_UNKNOWN (docs/configuration.md, retry).
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(log.started().len(), 1, "not sent again: it may have run");
    assert_told_once(&client, &log, REASON_ABANDONED).await;
    let sent = log.started().len();

    // The same key again: answered from the record, never sent.
    let again = tokio::time::timeout(secs(30), svc.oneshot(mutation()))
        .await
        .expect("answered from the record")
        .expect_err("the outcome is unknown");
    assert_eq!(again.kind(), ErrorKind::OutcomeUnknown, "{again}");
    assert_eq!(log.started().len(), sent, "nothing sent for the duplicate");
}

#[tokio::test(start_paused = true)]
async fn a_mutation_without_a_key_cut_by_its_idle_limit_is_sent_once() {
    let (client, _router, log) = start().await;
    let shield = Shield::from_config(
        ShieldConfig::from_toml_str(
            r#"
[defaults]
kind = "mutating"
timeout = { attempt = "60s", idle = "10s" }
retry = { max_attempts = 3, backoff = { strategy = "none" } }
idempotency = { derive_keys = false }
"#,
        )
        .expect("valid config"),
    )
    .expect("valid shield");
    let svc = shield.wrap("slow", client.clone());

    let err = svc
        .oneshot(ToolRequest::new("slow", json!({})).kind(CallKind::Mutating))
        .await
        .expect_err("cut");

    assert!(
        matches!(err.kind(), ErrorKind::Timeout | ErrorKind::OutcomeUnknown),
        "{err}"
    );
    assert_eq!(log.started().len(), 1);
    assert_told_once(&client, &log, REASON_ABANDONED).await;
}

#[tokio::test(start_paused = true)]
async fn an_idempotent_call_cut_by_its_idle_limit_is_retried_and_each_attempt_is_cancelled() {
    let (client, _router, log) = start().await;
    let svc = shield("idempotent").wrap("slow", client.clone());
    let begun = Instant::now();

    let err = svc
        .oneshot(ToolRequest::new("slow", json!({})).idempotency_key("sync-1"))
        .await
        .expect_err("every attempt is cut");

    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(begun.elapsed(), secs(30), "three attempts of 10 s");
    log.until("three cancellations", |l| {
        l.observed.lock().unwrap().len() == 3
    })
    .await;
    let started = log.started();
    settle(&client).await;
    assert_eq!(started.len(), 3);
    let mut notices = log.notices();
    notices.sort_by_key(|(id, _)| id.as_ref().map(ToString::to_string));
    let mut want: Vec<_> = started
        .iter()
        .map(|id| (Some(id.clone()), Some(REASON_ABANDONED.to_owned())))
        .collect();
    want.sort_by_key(|(id, _)| id.as_ref().map(ToString::to_string));
    assert_eq!(
        notices, want,
        "one notice per attempt, each with its own id"
    );
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_handshake_never_cancels_the_initialize_request() {
    // MCP: "The `initialize` request MUST NOT be cancelled by clients."
    let received = Arc::new(Mutex::new(Vec::<Value>::new()));
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let log = Arc::clone(&received);
    tokio::spawn(async move {
        let (r, _w) = tokio::io::split(server_io);
        let mut lines = BufReader::new(r).lines();
        // Never answers; records every message until the client goes away.
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(msg) = serde_json::from_str::<Value>(&line) {
                log.lock().unwrap().push(msg);
            }
        }
    });

    let connect = tokio::time::timeout(secs(5), McpClientService::connect(client_io)).await;
    assert!(connect.is_err(), "the server never answered");
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }

    let received = received.lock().unwrap().clone();
    assert_eq!(received[0]["method"], "initialize", "{received:?}");
    assert!(
        received
            .iter()
            .all(|m| m["method"] != "notifications/cancelled"),
        "{received:?}"
    );
}
