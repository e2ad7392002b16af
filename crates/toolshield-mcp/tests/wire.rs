//! An MCP server written by hand on the wire (JSON lines over an in-memory pipe, as the
//! stdio transport carries them), checked against the MCP specification: protocol version negotiation in
//! the `initialize` handshake, JSON-RPC error codes, unparsable lines, and concurrent
//! calls answered out of order.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, WriteHalf};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_mcp::McpClientService;
use tower::ServiceExt;

/// How the server answers `initialize`.
#[derive(Clone, Copy)]
enum Version {
    /// The version the client asked for (what a server that supports it does).
    Echo,
    /// A version of its own.
    Fixed(&'static str),
}

async fn send(w: &mut WriteHalf<DuplexStream>, msg: &Value) {
    let mut line = serde_json::to_vec(msg).unwrap();
    line.push(b'\n');
    let _ = w.write_all(&line).await;
}

async fn send_raw(w: &mut WriteHalf<DuplexStream>, line: &str) {
    let _ = w.write_all(line.as_bytes()).await;
    let _ = w.write_all(b"\n").await;
}

fn text_result(id: &Value, text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The ids of the `ignores_cancel` calls (`{"called": id}`) and the
/// `notifications/cancelled` params the server received, in order.
type Notices = Arc<Mutex<Vec<Value>>>;

/// One connection: the handshake, then each `tools/call` answered by the tool's name.
async fn serve(stream: DuplexStream, version: Version) {
    serve_logged(stream, version, Notices::default()).await;
}

async fn serve_logged(stream: DuplexStream, version: Version, notices: Notices) {
    let (r, mut w) = tokio::io::split(stream);
    let mut lines = BufReader::new(r).lines();
    // Calls of `pair` held until two are in, then answered in reverse order.
    let mut held: VecDeque<(Value, String)> = VecDeque::new();
    // A call of `ignores_cancel`, answered only once the next call arrives.
    let mut ignored: Option<Value> = None;
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        match msg.get("method").and_then(Value::as_str) {
            Some("initialize") => {
                let chosen = match version {
                    Version::Echo => msg["params"]["protocolVersion"].clone(),
                    Version::Fixed(v) => json!(v),
                };
                send(
                    &mut w,
                    &json!({"jsonrpc": "2.0", "id": id, "result": {
                        "protocolVersion": chosen,
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "wire", "version": "1"}
                    }}),
                )
                .await;
            }
            Some("notifications/cancelled") => {
                notices.lock().unwrap().push(msg["params"].clone());
            }
            Some("tools/call") => {
                // The receiver may ignore a cancellation: the late answer goes out first.
                if let Some(late) = ignored.take() {
                    send(&mut w, &text_result(&late, "late")).await;
                }
                let name = msg["params"]["name"].as_str().unwrap_or("").to_owned();
                let arg = msg["params"]["arguments"]["n"].to_string();
                match name.as_str() {
                    "garbage_first" => {
                        send_raw(&mut w, "this is not json {{{").await;
                        send_raw(&mut w, "\u{0}\u{1}\u{2}").await;
                        send(&mut w, &text_result(&id, "mine")).await;
                    }
                    "parse_error" => send(&mut w, &error(&id, -32700, "parse error")).await,
                    "invalid_request" => {
                        send(&mut w, &error(&id, -32600, "invalid request")).await;
                    }
                    "method_not_found" => {
                        send(&mut w, &error(&id, -32601, "method not found")).await;
                    }
                    "invalid_params" => {
                        send(&mut w, &error(&id, -32602, "`n` must be a number")).await;
                    }
                    "unknown_tool" => {
                        send(&mut w, &error(&id, -32602, "Unknown tool: unknown_tool")).await;
                    }
                    "internal_error" => send(&mut w, &error(&id, -32603, "boom")).await,
                    "server_defined" => send(&mut w, &error(&id, -32000, "quota")).await,
                    "ignores_cancel" => {
                        notices.lock().unwrap().push(json!({"called": id}));
                        ignored = Some(id);
                    }
                    "pair" => {
                        held.push_back((id, arg));
                        if held.len() == 2 {
                            while let Some((id, arg)) = held.pop_back() {
                                send(&mut w, &text_result(&id, &arg)).await;
                            }
                        }
                    }
                    _ => send(&mut w, &text_result(&id, "plain")).await,
                }
            }
            _ => {}
        }
    }
}

async fn connect(version: Version) -> Result<McpClientService, ToolError> {
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(serve(server_io, version));
    within(McpClientService::connect(client_io)).await
}

/// Bounds a step that must end on its own (a guard against a hang, not a timing).
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("the step ended")
}

async fn call(svc: &McpClientService, req: ToolRequest) -> Result<ToolResponse, ToolError> {
    within(svc.clone().oneshot(req)).await
}

fn text_of(res: &ToolResponse) -> &str {
    res.output["content"][0]["text"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_server_that_answers_with_the_clients_version_is_used() {
    let svc = connect(Version::Echo).await.unwrap();
    let res = call(&svc, ToolRequest::new("plain", json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&res), "plain");
}

#[tokio::test]
async fn a_server_that_answers_with_an_older_known_version_is_used() {
    // Negotiation: the server may answer with another version it supports; a version
    // the client knows is fine.
    let svc = connect(Version::Fixed("2025-03-26")).await.unwrap();
    let res = call(&svc, ToolRequest::new("plain", json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&res), "plain");
}

#[tokio::test]
async fn a_server_whose_protocol_version_the_client_does_not_support_is_refused_at_connect() {
    // MCP lifecycle: "If the client does not support the version in the server's
    // response, it SHOULD disconnect."
    for version in ["1999-01-01", "not-a-version", ""] {
        let err = connect(Version::Fixed(version)).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::ConnectionFailed,
            "{version}: {err:?}"
        );
        assert!(
            err.message().contains("protocol version"),
            "{version}: {}",
            err.message()
        );
    }
}

#[tokio::test]
async fn an_unsupported_protocol_version_of_any_length_makes_a_bounded_error() {
    let huge: &'static str = Box::leak("9".repeat(1 << 20).into_boxed_str());
    let err = connect(Version::Fixed(huge)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    assert!(
        err.message().len() <= 2 * toolshield_mcp::MAX_MESSAGE,
        "{} bytes",
        err.message().len()
    );
}

#[tokio::test]
async fn unparsable_lines_from_the_server_are_ignored_and_the_call_gets_its_answer() {
    let svc = connect(Version::Echo).await.unwrap();
    let res = call(&svc, ToolRequest::new("garbage_first", json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&res), "mine");
    let res = call(&svc, ToolRequest::new("plain", json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&res), "plain");
}

#[tokio::test]
async fn json_rpc_error_codes_map_to_their_documented_kinds() {
    let svc = connect(Version::Echo).await.unwrap();
    for (tool, kind) in [
        ("parse_error", ErrorKind::InvalidInput),
        ("invalid_request", ErrorKind::InvalidInput),
        ("method_not_found", ErrorKind::NotFound),
        ("invalid_params", ErrorKind::InvalidInput),
        ("unknown_tool", ErrorKind::NotFound),
        ("internal_error", ErrorKind::ExecutionFailed),
        ("server_defined", ErrorKind::ExecutionFailed),
    ] {
        let err = call(&svc, ToolRequest::new(tool, json!({})))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{tool}: {err:?}");
    }
    // The connection is still good after every error answer.
    let res = call(&svc, ToolRequest::new("plain", json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&res), "plain");
}

#[tokio::test]
async fn concurrent_calls_answered_in_reverse_order_each_get_their_own_answer() {
    let svc = connect(Version::Echo).await.unwrap();
    let a = call(&svc, ToolRequest::new("pair", json!({"n": 1})));
    let b = call(&svc, ToolRequest::new("pair", json!({"n": 2})));
    let (a, b) = tokio::join!(a, b);
    assert_eq!(text_of(&a.unwrap()), "1");
    assert_eq!(text_of(&b.unwrap()), "2");
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_call_is_cancelled_once_and_its_late_answer_reaches_no_other_call() {
    let notices = Notices::default();
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(serve_logged(server_io, Version::Echo, Arc::clone(&notices)));
    let svc = within(McpClientService::connect(client_io)).await.unwrap();
    // The caller gives up on the call (as the attempt timeout does, by dropping it).
    let abandoned = tokio::time::timeout(
        Duration::from_secs(5),
        svc.clone()
            .oneshot(ToolRequest::new("ignores_cancel", json!({}))),
    )
    .await;
    assert!(abandoned.is_err(), "the server never answered in time");
    // The server ignores the notice and answers late, just before the next call's
    // answer: the late answer's id is no longer awaited.
    let res = call(&svc, ToolRequest::new("plain", json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&res), "plain");
    let notices = notices.lock().unwrap().clone();
    // The call, then exactly one notice, for that call's id, with a reason.
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert_eq!(notices[1]["requestId"], notices[0]["called"], "{notices:?}");
    assert!(notices[1]["reason"].is_string(), "{notices:?}");
}
