//! A hostile or broken HTTP peer, written by hand on a raw TCP socket (127.0.0.1:0):
//! endless and cut bodies, odd statuses, every `Retry-After` form, connections closed
//! before or after the headers. Whatever it does, `HttpTool` answers a typed `ToolError`
//! of the right kind (or a response), never a panic, never unbounded memory.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_http::{http_tool_request, HttpTool};
use toolshield_test::raw_http::{self, Script};
use tower::ServiceExt;

/// A server that runs `script` on every connection: its address and how many requests
/// it read.
async fn serve(script: Script) -> (SocketAddr, Arc<AtomicUsize>) {
    let server = raw_http::serve(script);
    (server.addr, server.requests)
}

fn raw(text: &str) -> Script {
    Script::raw(text)
}

async fn call(tool: HttpTool, req: ToolRequest) -> Result<ToolResponse, ToolError> {
    tokio::time::timeout(Duration::from_secs(20), tool.oneshot(req))
        .await
        .expect("the call ends: no peer can hold it forever")
}

fn get(addr: SocketAddr) -> ToolRequest {
    http_tool_request("api", json!({"url": format!("http://{addr}/r")}))
}

fn post(addr: SocketAddr) -> ToolRequest {
    http_tool_request(
        "api",
        json!({"method": "POST", "url": format!("http://{addr}/r"), "body": {"a": 1}}),
    )
}

// ---------------------------------------------------------------------------------
// Bodies

#[tokio::test]
async fn an_endless_body_is_cut_at_the_limit_while_it_streams() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
    let (addr, _) = serve(Script::Endless(head)).await;
    let tool = HttpTool::new().body_limit(256 * 1024);
    let err = call(tool.clone(), get(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    // A mutation's answer over the limit: the server ran it.
    let err = call(tool, post(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
}

#[tokio::test]
async fn a_body_cut_mid_way_is_outcome_unknown_for_a_post_and_retriable_for_a_get() {
    let (addr, _) = serve(raw(
        "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b",
    ))
    .await;
    let err = call(HttpTool::new(), post(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    let err = call(HttpTool::new(), get(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable, "{err}");
}

#[tokio::test]
async fn a_connection_closed_before_the_headers_is_outcome_unknown_for_a_post() {
    let (addr, seen) = serve(Script::Close).await;
    let err = call(HttpTool::new(), post(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the server had the request");
    // Half a status line, then close.
    let (addr, _) = serve(raw("HTTP/1.1 20")).await;
    let err = call(HttpTool::new(), post(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    // Garbage instead of HTTP.
    let (addr, _) = serve(raw("SSH-2.0-OpenSSH_9.6\r\n\r\n")).await;
    let err = call(HttpTool::new(), post(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
}

#[tokio::test]
async fn a_get_the_caller_declared_mutating_is_outcome_unknown_when_lost() {
    // The kind of the ToolRequest (a tool declared mutating, or the default) decides,
    // not the method.
    let (addr, _) = serve(Script::Close).await;
    let req = ToolRequest::new("api", json!({"url": format!("http://{addr}/r")}))
        .kind(CallKind::Mutating);
    let err = call(HttpTool::new(), req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
}

#[tokio::test]
async fn odd_bodies_and_content_types_are_answered_as_text() {
    for (head, body) in [
        // Says JSON, is not.
        ("content-type: application/json", &b"{\"a\": 1"[..]),
        // Not UTF-8 at all.
        ("content-type: application/json", &b"\xff\xfe\x00{"[..]),
        ("content-type: text/plain; charset=latin1", &b"caf\xe9"[..]),
        // No content type.
        ("x-nothing: 1", &b"[1,2]"[..]),
    ] {
        let mut bytes = format!(
            "HTTP/1.1 200 OK\r\n{head}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        bytes.extend_from_slice(body);
        let (addr, _) = serve(Script::Write(bytes)).await;
        let res = call(HttpTool::new(), get(addr)).await.unwrap();
        assert_eq!(res.output["status"], 200);
        assert!(res.output["body"].is_string(), "{head}: {}", res.output);
    }
}

#[tokio::test]
async fn headers_with_bytes_that_are_not_text_reach_the_output_as_text() {
    let mut bytes = b"HTTP/1.1 200 OK\r\nx-odd: a\xff\x80b\tc\r\nset-cookie: sid=secret\r\ncontent-length: 0\r\n\r\n".to_vec();
    bytes.extend_from_slice(b"");
    let (addr, _) = serve(Script::Write(bytes)).await;
    let res = call(HttpTool::new(), get(addr)).await.unwrap();
    assert!(res.output["headers"]["x-odd"].is_string(), "{}", res.output);
    assert!(!res.output.to_string().contains("secret"));
}

// ---------------------------------------------------------------------------------
// Statuses

#[tokio::test]
async fn statuses_without_an_error_class_are_answered_and_invalid_ones_are_5xx() {
    for (line, expected) in [
        ("HTTP/1.1 204 No Content\r\n\r\n", Ok(204)),
        ("HTTP/1.1 304 Not Modified\r\n\r\n", Ok(304)),
        (
            "HTTP/1.1 302 Found\r\nlocation: http://example.invalid/\r\ncontent-length: 0\r\n\r\n",
            Ok(302),
        ),
        (
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            Ok(200),
        ),
        (
            "HTTP/1.1 600 Nope\r\ncontent-length: 0\r\n\r\n",
            Err(ErrorKind::ExecutionFailed),
        ),
        (
            "HTTP/1.1 999 Nope\r\ncontent-length: 0\r\n\r\n",
            Err(ErrorKind::ExecutionFailed),
        ),
    ] {
        let (addr, _) = serve(raw(line)).await;
        let got = call(HttpTool::new(), get(addr)).await;
        match (got, expected) {
            (Ok(res), Ok(status)) => assert_eq!(res.output["status"], status, "{line}"),
            (Err(e), Err(kind)) => assert_eq!(e.kind(), kind, "{line}: {e}"),
            (got, want) => panic!("{line}: {got:?}, expected {want:?}"),
        }
    }
}

async fn error_of(status: u16, retry_after: &[&str]) -> ToolError {
    let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n");
    for v in retry_after {
        head.push_str(&format!("retry-after: {v}\r\n"));
    }
    head.push_str("\r\n");
    let (addr, _) = serve(Script::Write(head.into_bytes())).await;
    call(HttpTool::new(), get(addr)).await.unwrap_err()
}

#[tokio::test]
async fn retry_after_in_every_form_on_429_and_503() {
    let max = toolshield_core::config::MAX_DURATION;
    let in_a_minute = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(60));
    let cases: Vec<(Vec<String>, Option<Duration>)> = vec![
        (vec!["7".into()], Some(Duration::from_secs(7))),
        (vec!["0".into()], Some(Duration::ZERO)),
        (
            vec!["Wed, 21 Oct 2015 07:28:00 GMT".into()],
            Some(Duration::ZERO),
        ),
        (vec!["99999999999999999999999999".into()], Some(max)),
        (vec!["Fri, 31 Dec 9999 23:59:59 GMT".into()], Some(max)),
        (vec!["soon".into()], None),
        (vec!["-5".into()], None),
        (vec!["1.5".into()], None),
        (vec!["".into()], None),
        (
            vec!["3".into(), "garbage".into(), "9".into()],
            Some(Duration::from_secs(9)),
        ),
    ];
    for status in [429, 503] {
        let kind = if status == 429 {
            ErrorKind::RateLimited
        } else {
            ErrorKind::UpstreamUnavailable
        };
        for (values, want) in &cases {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            let err = error_of(status, &values).await;
            assert_eq!(err.kind(), kind, "{status} {values:?}");
            assert_eq!(err.retry_after(), *want, "{status} {values:?}");
        }
        let err = error_of(status, &[&in_a_minute]).await;
        let wait = err.retry_after().expect("a date in the future is a wait");
        assert!(
            wait > Duration::from_secs(50) && wait <= Duration::from_secs(60),
            "{wait:?}"
        );
    }
    // Never retried: no wait, whatever the server says.
    for status in [500, 401, 404, 400] {
        let err = error_of(status, &["5"]).await;
        assert_eq!(err.retry_after(), None, "{status}");
    }
}

#[tokio::test]
async fn a_retry_after_with_bytes_that_are_not_text_is_ignored() {
    let (addr, _) = serve(Script::Write(
        b"HTTP/1.1 503 X\r\nretry-after: 5\xff\r\ncontent-length: 0\r\n\r\n".to_vec(),
    ))
    .await;
    let err = call(HttpTool::new(), get(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(err.retry_after(), None);
}

// ---------------------------------------------------------------------------------
// Messages

fn assert_clean(err: &ToolError, secret: &str) {
    assert!(
        !err.message().contains(secret),
        "a payload value reached the message: {}",
        err.message()
    );
    assert!(
        !err.for_model("api").contains(secret),
        "a payload value reached the model's text: {}",
        err.for_model("api")
    );
    assert!(err.message().len() < 4096, "{} bytes", err.message().len());
}

#[tokio::test]
async fn an_invalid_method_is_not_repeated_in_the_message() {
    // A model that puts a whole request line (with its credential) into `method`: the
    // message must not echo it, as it does not echo an invalid URL.
    let secret = "sk_live_51Hx";
    let req = http_tool_request(
        "api",
        json!({"method": format!("POST /charge?api_key={secret}"), "url": "http://127.0.0.1:9/"}),
    );
    let err = call(HttpTool::new(), req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_clean(&err, secret);
    // Nor any size: a method of 1 MiB.
    let req = http_tool_request(
        "api",
        json!({"method": format!("{} x", "P".repeat(1 << 20)), "url": "http://127.0.0.1:9/"}),
    );
    let err = call(HttpTool::new(), req).await.unwrap_err();
    assert_clean(&err, secret);
}

#[tokio::test]
async fn header_values_stay_out_of_messages() {
    let secret = "Bearer sk_live_51Hx";
    let req = http_tool_request(
        "api",
        json!({"url": "http://127.0.0.1:9/", "headers": {"authorization": format!("{secret}\n")}}),
    );
    let err = call(HttpTool::new(), req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_clean(&err, secret);
    let req = http_tool_request(
        "api",
        json!({"url": "http://127.0.0.1:9/", "headers": {"idempotency-key": format!("{secret}\u{1}")}, "method": "POST"}),
    );
    let err = call(HttpTool::new(), req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_clean(&err, secret);
}

#[tokio::test]
async fn the_response_body_never_reaches_an_error_message() {
    let body = "card 4242424242424242 declined";
    let (addr, _) = serve(raw(&format!(
        "HTTP/1.1 402 X\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )))
    .await;
    let err = call(HttpTool::new(), post(addr)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_clean(&err, "4242");
    let _: Value = json!(null);
}
