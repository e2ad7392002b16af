//! A hostile or broken HTTP peer for the reqwest adapter, written by hand on a raw TCP
//! socket (127.0.0.1:0): endless and cut bodies, redirects, connections closed after the
//! request. The kind of the call (the `ToolRequest`'s, not only the method's) decides what
//! a lost connection or an oversized answer becomes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_http::http_tool_request;
use toolshield_reqwest::RetryAfter;
use toolshield_reqwest::{http_tool, Client};
use toolshield_test::raw_http::{self, Script};
use tower::ServiceExt;

/// A server that runs `script` on every connection: its address, how many requests it
/// read, and their heads (lower-cased).
async fn serve(script: Script) -> (SocketAddr, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
    let server = raw_http::serve(script);
    (server.addr, server.requests, server.heads)
}

fn raw(text: &str) -> Script {
    Script::raw(text)
}

fn endless_ok() -> Script {
    Script::Endless(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n",
    )
}

async fn tool_call(req: ToolRequest) -> Result<ToolResponse, ToolError> {
    let tool = http_tool(Client::new(reqwest::Client::new()));
    tokio::time::timeout(Duration::from_secs(30), tool.oneshot(req))
        .await
        .expect("the call ends")
}

async fn raw_call(
    client: Client,
    req: http::Request<Bytes>,
) -> Result<http::Response<Bytes>, ToolError> {
    tokio::time::timeout(Duration::from_secs(30), client.oneshot(req))
        .await
        .expect("the call ends")
}

fn request(method: &str, url: String) -> http::Request<Bytes> {
    http::Request::builder()
        .method(method)
        .uri(url)
        .body(Bytes::from_static(b"{}"))
        .unwrap()
}

#[tokio::test]
async fn a_get_the_caller_declared_mutating_is_outcome_unknown_when_the_connection_is_lost() {
    // `ToolRequest::new` is `Mutating` until declared otherwise (and a tool declared
    // mutating makes every call so): `toolshield_http::HttpTool` over hyper answers
    // OUTCOME_UNKNOWN here; over reqwest the method alone decides, and the answer is the
    // retriable UPSTREAM_UNAVAILABLE: a retry would run the side effect again, and the
    // idempotency layer frees the key.
    let (addr, seen, _) = serve(Script::Close).await;
    let req = ToolRequest::new("api", json!({"url": format!("http://{addr}/reset")}))
        .kind(CallKind::Mutating);
    let err = tool_call(req).await.unwrap_err();
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the server had the request");
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
}

#[tokio::test]
async fn a_get_the_caller_declared_mutating_whose_answer_is_over_the_limit_is_outcome_unknown() {
    // The server ran it; only the answer is too large (over the client's 4 MiB).
    let (addr, _, _) = serve(endless_ok()).await;
    let req = ToolRequest::new("api", json!({"url": format!("http://{addr}/reset")}))
        .kind(CallKind::Mutating);
    let err = tool_call(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
}

#[tokio::test]
async fn a_post_whose_connection_is_lost_is_outcome_unknown_and_a_get_retriable() {
    let (addr, _, _) = serve(Script::Close).await;
    let post = http_tool_request(
        "api",
        json!({"method": "POST", "url": format!("http://{addr}/r"), "body": {"a": 1}}),
    );
    assert_eq!(
        tool_call(post).await.unwrap_err().kind(),
        ErrorKind::OutcomeUnknown
    );
    let get = http_tool_request("api", json!({"url": format!("http://{addr}/r")}));
    assert_eq!(
        tool_call(get).await.unwrap_err().kind(),
        ErrorKind::UpstreamUnavailable
    );
    // Cut mid-body.
    let (addr, _, _) = serve(raw(
        "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nten bytes!",
    ))
    .await;
    let err = raw_call(
        Client::default(),
        request("POST", format!("http://{addr}/r")),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    let err = raw_call(
        Client::default(),
        request("GET", format!("http://{addr}/r")),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable, "{err}");
}

#[tokio::test]
async fn an_endless_body_is_cut_at_the_limit_and_an_error_status_keeps_its_retry_after() {
    let (addr, _, _) = serve(endless_ok()).await;
    let client = Client::default().body_limit(64 * 1024);
    let err = raw_call(client.clone(), request("GET", format!("http://{addr}/r")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let err = raw_call(client.clone(), request("POST", format!("http://{addr}/r")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");

    let (addr, _, _) = serve(Script::Endless(
        "HTTP/1.1 503 X\r\nretry-after: 12\r\ntransfer-encoding: chunked\r\n\r\n",
    ))
    .await;
    let res = raw_call(client, request("GET", format!("http://{addr}/r")))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(res.body().len(), 64 * 1024);
    assert_eq!(
        res.extensions().get::<RetryAfter>(),
        Some(&RetryAfter(Duration::from_secs(12)))
    );
}

#[tokio::test]
async fn a_redirect_to_another_host_drops_the_credentials() {
    let (target, _, heads) = serve(raw("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")).await;
    // Same machine, another host name: `localhost` is not `127.0.0.1`.
    let (addr, _, _) = serve(raw(&format!(
        "HTTP/1.1 307 X\r\nlocation: http://localhost:{}/landed\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        target.port()
    )))
    .await;
    let req = http::Request::builder()
        .method("GET")
        .uri(format!("http://{addr}/r"))
        .header("authorization", "Bearer sk_live_51Hx")
        .header("cookie", "sid=secret")
        .body(Bytes::new())
        .unwrap();
    let res = raw_call(Client::default(), req).await.unwrap();
    assert_eq!(res.status(), 200);
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 1);
    assert!(!heads[0].contains("sk_live"), "{}", heads[0]);
    assert!(!heads[0].contains("sid=secret"), "{}", heads[0]);
}

#[tokio::test]
async fn a_redirect_loop_is_outcome_unknown_for_a_post_and_execution_failed_for_a_get() {
    let (addr, seen, _) = serve(raw(
        "HTTP/1.1 307 X\r\nlocation: /again\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
    ))
    .await;
    let err = raw_call(
        Client::default(),
        request("POST", format!("http://{addr}/r")),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    let err = raw_call(
        Client::default(),
        request("GET", format!("http://{addr}/r")),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed, "{err}");
    assert!(
        seen.load(Ordering::SeqCst) <= 2 * 11,
        "bounded by the redirect policy"
    );
}

#[tokio::test]
async fn a_url_with_credentials_never_reaches_the_message() {
    let (addr, _, _) = serve(Script::Close).await;
    let url = format!("http://user:hunter2@{addr}/r?api_key=sk_live_51Hx");
    let err = raw_call(Client::default(), request("GET", url))
        .await
        .unwrap_err();
    let text = format!("{err} {:?} {}", err.message(), err.for_model("api"));
    let mut source = std::error::Error::source(&err);
    let mut chain = String::new();
    while let Some(s) = source {
        chain.push_str(&s.to_string());
        source = s.source();
    }
    for secret in ["hunter2", "sk_live"] {
        assert!(!text.contains(secret), "{text}");
        assert!(!chain.contains(secret), "{chain}");
    }
}
