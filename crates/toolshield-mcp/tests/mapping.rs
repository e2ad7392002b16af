//! How MCP results and protocol errors map to toolshield responses and `ErrorKind`s.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolshield::prelude::*;
use toolshield::shield::RouterBuilder;
use toolshield_core::{Classify, DefaultClassifier};
use toolshield_mcp::IsErrorPolicy;
use tower::ServiceExt;

#[tokio::test]
async fn success_output_is_the_mcp_result() {
    let (client, _seen, _server) = common::start().await;
    let res = client
        .oneshot(ToolRequest::new("echo", json!({"q": "x"})))
        .await
        .unwrap();
    assert_eq!(res.output["structuredContent"], json!({"q": "x"}));
    assert_eq!(res.output["content"][0]["type"], "text");
    assert!(!res.is_error());
}

#[tokio::test]
async fn is_error_is_kept_by_default_and_an_error_on_request() {
    let (client, _seen, _server) = common::start().await;
    let res = client
        .clone()
        .oneshot(ToolRequest::new("broken", json!({})))
        .await
        .unwrap();
    assert_eq!(res.output["isError"], true);
    assert_eq!(
        DefaultClassifier.classify(&Ok(res)).kind(),
        Some(ErrorKind::ExecutionFailed)
    );

    let err = client
        .is_error_policy(IsErrorPolicy::Error(ErrorKind::UpstreamUnavailable))
        .oneshot(ToolRequest::new("broken", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert!(err.message().contains("disk full"), "{}", err.message());
}

#[tokio::test]
async fn unknown_tool_is_not_found_and_bad_params_invalid_input() {
    let (client, _seen, _server) = common::start().await;
    let err = client
        .clone()
        .oneshot(ToolRequest::new("nope", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let err = client
        .clone()
        .oneshot(ToolRequest::new("strict", json!({"n": "x"})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let ok = client
        .clone()
        .oneshot(ToolRequest::new("strict", json!({"n": 2})))
        .await
        .unwrap();
    assert_eq!(ok.output["content"][0]["text"], "2");
    let err = client
        .oneshot(ToolRequest::new("echo", json!([1, 2])))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::InvalidInput,
        "a non-object payload is never sent"
    );
}

#[tokio::test]
async fn server_prefix_is_stripped_behind_the_router() {
    let (client, seen, _server) = common::start().await;
    let router = RouterBuilder::unshielded()
        .server("files", client.clone().with_server("files"))
        .tool("local_echo", client.tool("echo"))
        .build()
        .expect("valid tool names");
    let res = router
        .clone()
        .oneshot(ToolRequest::new("files__echo", json!({"p": 1})))
        .await
        .unwrap();
    assert_eq!(res.output["structuredContent"], json!({"p": 1}));
    let res = router
        .oneshot(ToolRequest::new("local_echo", json!({"p": 2})))
        .await
        .unwrap();
    assert_eq!(res.output["structuredContent"], json!({"p": 2}));
    assert_eq!(seen.echo.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn closed_transport_is_connection_failed() {
    let (client, _seen, server) = common::start().await;
    server.abort();
    let _ = server.await;
    let err = client
        .oneshot(ToolRequest::new("echo", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");
}

#[tokio::test]
async fn a_cancelled_call_token_stops_the_call() {
    let (client, seen, _server) = common::start().await;
    let token = CancellationToken::new();
    let req = ToolRequest::new("hang", json!({})).cancel_token(token.clone());
    let call = tokio::spawn(client.oneshot(req));
    tokio::time::timeout(Duration::from_secs(10), async {
        while seen.hang.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the server receives the call");
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
}
