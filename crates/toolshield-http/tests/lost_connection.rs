//! A connection lost after the request was sent, against real servers: a mutating call's
//! outcome is unknown (never repeated, its key kept); anything else stays retriable. A
//! connection refused sent nothing: retriable, and the key is released.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use serde_json::json;
use toolshield_core::{ErrorKind, ToolError};
use toolshield_http::{http_tool_request, hyper_client, BufferBodyLayer, HttpErrorLayer, HttpTool};
use toolshield_timeout::TimeoutLayer;
use tower::{Service, ServiceBuilder, ServiceExt};

type Resp = http::Response<hyper::body::Incoming>;

/// buffer > retry (3 attempts) > attempt timeout > errors > hyper client.
fn raw_stack() -> impl Service<Request<Full<Bytes>>, Response = Resp, Error = ToolError> + Clone {
    let retry = support::retry_now(3);
    ServiceBuilder::new()
        .layer(BufferBodyLayer::default())
        .layer(retry)
        .layer(TimeoutLayer::new(Duration::from_secs(5)))
        .layer(HttpErrorLayer::new())
        .service(hyper_client())
}

fn order(addr: std::net::SocketAddr) -> serde_json::Value {
    json!({
        "method": "POST",
        "url": format!("http://{addr}/orders"),
        "headers": {"Idempotency-Key": "order-7"},
        "body": {"item": "book"},
    })
}

#[tokio::test]
async fn a_post_whose_connection_drops_after_sending_is_outcome_unknown_and_runs_once() {
    let (addr, ran) = support::start_dropping().await;
    let shield = support::shield();
    let api = shield.wrap("api", HttpTool::new());

    let err = api
        .clone()
        .oneshot(http_tool_request("api", order(addr)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the POST was not repeated");

    // The key is kept: the same call again is answered from the record, not sent.
    let again = api
        .oneshot(http_tool_request("api", order(addr)))
        .await
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the handler still ran once");
    let record = shield
        .idempotency("api")
        .record_for(&http_tool_request("api", order(addr)))
        .await
        .unwrap()
        .expect("the key is kept");
    assert_eq!(
        record.error.map(|e| e.kind),
        Some(ErrorKind::OutcomeUnknown)
    );
}

#[tokio::test]
async fn a_get_whose_connection_drops_after_sending_stays_retriable() {
    let (addr, ran) = support::start_dropping().await;
    let err = support::shield()
        .wrap("api", HttpTool::new())
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/orders/7")}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable, "{err}");
    assert!(err.is_retriable());
    assert_eq!(
        ran.load(Ordering::SeqCst),
        3,
        "an idempotent GET is retried"
    );
}

#[tokio::test]
async fn a_refused_connection_is_connection_failed_and_frees_the_key() {
    let addr = support::refusing_addr();
    let shield = support::shield();
    let err = shield
        .wrap("api", HttpTool::new())
        .oneshot(http_tool_request("api", order(addr)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");
    assert!(err.is_retriable());
    let record = shield
        .idempotency("api")
        .record_for(&http_tool_request("api", order(addr)))
        .await
        .unwrap();
    assert!(record.is_none(), "nothing was sent: the key is released");
}

#[tokio::test]
async fn a_raw_post_whose_connection_drops_is_outcome_unknown_and_not_repeated() {
    let (addr, ran) = support::start_dropping().await;
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}/orders"))
        .header("idempotency-key", "order-8")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let err = raw_stack().oneshot(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "keeps the client's error"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    // A GET on the same server: retriable, so all three attempts go out.
    let get = Request::builder()
        .uri(format!("http://{addr}/orders/8"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let err = raw_stack().oneshot(get).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable, "{err}");
    assert_eq!(ran.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_raw_post_to_a_refused_port_is_connection_failed() {
    let addr = support::refusing_addr();
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}/orders"))
        .header("idempotency-key", "order-9")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let err = raw_stack().oneshot(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");
}
