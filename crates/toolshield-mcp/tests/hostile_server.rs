//! A hostile MCP server, written by hand on the wire (JSON lines over an in-memory pipe):
//! answers for ids it was never sent, a wrong id before the right one, a result that is
//! not a tool result, a message over the transport's size limit. The client neither
//! panics nor hands one call another call's answer.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_mcp::McpClientService;
use tower::ServiceExt;

async fn send(w: &mut tokio::io::WriteHalf<DuplexStream>, msg: &Value) {
    let mut line = serde_json::to_vec(msg).unwrap();
    line.push(b'\n');
    // A closed pipe (the client gave up on us) is fine.
    let _ = w.write_all(&line).await;
}

fn text_result(id: &Value, text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
}

/// Serves the handshake, then answers each `tools/call` by the tool's name.
async fn serve(io: DuplexStream) {
    let (r, mut w) = tokio::io::split(io);
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        match msg.get("method").and_then(Value::as_str) {
            Some("initialize") => {
                let version = msg["params"]["protocolVersion"].clone();
                send(
                    &mut w,
                    &json!({"jsonrpc": "2.0", "id": id, "result": {
                        "protocolVersion": version,
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "hostile", "version": "1"}
                    }}),
                )
                .await;
            }
            Some("tools/call") => {
                let name = msg["params"]["name"].as_str().unwrap_or("").to_owned();
                match name.as_str() {
                    "unsolicited" => {
                        for other in [json!(987_654), json!("never-sent"), json!(-1)] {
                            send(&mut w, &text_result(&other, "not yours")).await;
                            send(
                                &mut w,
                                &json!({"jsonrpc": "2.0", "id": other, "error": {"code": -32603, "message": "not yours"}}),
                            )
                            .await;
                        }
                        send(&mut w, &json!({"jsonrpc": "2.0", "method": "notifications/made_up", "params": {}})).await;
                        send(&mut w, &json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "nobody", "progress": 1}})).await;
                        send(&mut w, &text_result(&id, "mine")).await;
                    }
                    "wrong_id_first" => {
                        let wrong = json!(id.as_i64().unwrap_or(0) + 1);
                        send(&mut w, &text_result(&wrong, "for the next call")).await;
                        send(&mut w, &text_result(&id, "mine")).await;
                    }
                    "not_a_tool_result" => {
                        send(&mut w, &json!({"jsonrpc": "2.0", "id": id, "result": {"content": 5, "isError": "yes"}})).await;
                    }
                    "huge" => {
                        let big = "x".repeat(17 * 1024 * 1024);
                        send(&mut w, &text_result(&id, &big)).await;
                    }
                    _ => send(&mut w, &text_result(&id, "plain")).await,
                }
            }
            _ => {}
        }
    }
}

async fn client() -> McpClientService {
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(serve(server_io));
    McpClientService::connect(client_io).await.unwrap()
}

async fn call(svc: &McpClientService, tool: &str) -> Result<ToolResponse, ToolError> {
    let fut = svc.clone().oneshot(ToolRequest::new(tool, json!({})));
    // The stack's attempt timeout, in short.
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| Err(ToolError::timeout("attempt timed out")))
}

fn text_of(res: &ToolResponse) -> &str {
    res.output["content"][0]["text"].as_str().unwrap_or("")
}

#[tokio::test(start_paused = true)]
async fn answers_for_ids_never_sent_are_ignored_and_each_call_gets_its_own() {
    let svc = client().await;
    let res = call(&svc, "unsolicited").await.unwrap();
    assert_eq!(text_of(&res), "mine");
    // An answer for the id the next call will get, sent before that call exists, is
    // not kept for it.
    let res = call(&svc, "wrong_id_first").await.unwrap();
    assert_eq!(text_of(&res), "mine");
    let res = call(&svc, "plain").await.unwrap();
    assert_eq!(text_of(&res), "plain");
}

#[tokio::test(start_paused = true)]
async fn a_result_that_is_not_a_tool_result_is_a_typed_error() {
    let svc = client().await;
    let read = ToolRequest::new("not_a_tool_result", json!({})).kind(CallKind::ReadOnly);
    let err = tokio::time::timeout(Duration::from_secs(30), svc.clone().oneshot(read))
        .await
        .expect("answered")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed);
    assert_eq!(text_of(&call(&svc, "plain").await.unwrap()), "plain");
}

#[tokio::test(start_paused = true)]
async fn a_mutation_answered_with_something_other_than_a_tool_result_is_outcome_unknown() {
    // The server took the call and answered it: the tool may have run. A plain failure
    // would let the idempotency layer free the key after its short failure TTL, and a
    // repeat would run the mutation again.
    let svc = client().await;
    let req = ToolRequest::new("not_a_tool_result", json!({})).kind(CallKind::Mutating);
    let err = tokio::time::timeout(Duration::from_secs(30), svc.clone().oneshot(req))
        .await
        .expect("answered")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn an_answer_over_the_size_limit_is_never_delivered_and_the_client_goes_on() {
    // rmcp drops a line over its 16 MiB limit: the call is left to the caller's timeout
    // (the stack's attempt timeout), and the connection keeps working.
    let svc = client().await;
    let err = call(&svc, "huge").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(text_of(&call(&svc, "plain").await.unwrap()), "plain");
}

#[tokio::test(start_paused = true)]
async fn a_failed_handshake_cannot_make_the_error_any_size() {
    // The server answers `initialize` with an error carrying a 1 MiB message, all of
    // which rmcp quotes in its handshake error.
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        let (r, mut w) = tokio::io::split(server_io);
        let mut lines = BufReader::new(r).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if msg.get("method").and_then(Value::as_str) == Some("initialize") {
                let huge = format!("no\n{}", "x".repeat(1 << 20));
                send(
                    &mut w,
                    &json!({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": huge}}),
                )
                .await;
            }
        }
    });
    let err = McpClientService::connect(client_io).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    assert!(
        err.message().len() <= 2 * toolshield_mcp::MAX_MESSAGE,
        "{} bytes",
        err.message().len()
    );
}
