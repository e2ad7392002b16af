//! The `Idempotency-Key` the server sees: a mutating call is repeated only under a key
//! on the wire, one key per request, blank keys are no key. Against a real axum server.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_core::{CallKind, ErrorKind, ShieldRequest, ToolRequest};
use toolshield_http::{
    http_tool_request, hyper_client, BufferBodyLayer, HttpErrorLayer, HttpTool,
    IDEMPOTENCY_KEY_HEADER,
};
use tower::{ServiceBuilder, ServiceExt};

fn shield(extra: &str) -> Shield {
    let cfg = ShieldConfig::from_toml_str(&format!(
        r#"
        [defaults.retry]
        max_attempts = 3
        backoff = {{ strategy = "none" }}
        {extra}
        "#
    ))
    .unwrap();
    Shield::from_config(cfg).unwrap()
}

#[tokio::test]
async fn a_keyless_post_in_the_default_stack_is_repeated_only_under_one_key_the_server_sees() {
    let (addr, rec) = support::start().await;
    // The default configuration: derived keys on.
    let err = shield("")
        .wrap("api", HttpTool::new())
        .oneshot(http_tool_request(
            "api",
            json!({"method": "POST", "url": format!("http://{addr}/keyed503"), "body": {"n": 1}}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    let keys = rec.keys("/keyed503");
    assert_eq!(keys.len(), 3, "503 is retried");
    for sent in &keys {
        assert_eq!(
            sent.len(),
            1,
            "one Idempotency-Key header per attempt: {keys:?}"
        );
        assert!(!sent[0].trim().is_empty());
        assert_eq!(sent, &keys[0], "the same key on every attempt: {keys:?}");
    }
}

#[tokio::test]
async fn a_key_given_on_the_tool_request_is_sent_as_the_header() {
    let (addr, rec) = support::start().await;
    let req = ToolRequest::new(
        "api",
        json!({"method": "POST", "url": format!("http://{addr}/keyed200")}),
    )
    .kind(CallKind::Mutating)
    .idempotency_key("order-1");
    HttpTool::new().oneshot(req).await.unwrap();
    assert_eq!(rec.keys("/keyed200"), vec![vec!["order-1".to_owned()]]);
}

#[tokio::test]
async fn a_blank_idempotency_key_is_no_key() {
    for blank in ["", "   "] {
        let req = http_tool_request(
            "api",
            json!({"method": "POST", "url": "http://x/", "headers": {"Idempotency-Key": blank}}),
        );
        assert_eq!(req.call_idempotency_key(), None, "{blank:?}");
    }

    // Without derived keys a blank key makes the POST keyless: sent once, and the blank
    // header is not sent.
    let (addr, rec) = support::start().await;
    let err = shield("[defaults.idempotency]\nderive_keys = false")
        .wrap("api", HttpTool::new())
        .oneshot(http_tool_request(
            "api",
            json!({
                "method": "POST",
                "url": format!("http://{addr}/keyed503"),
                "headers": {"Idempotency-Key": ""},
            }),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(rec.keys("/keyed503"), vec![Vec::<String>::new()]);
}

#[tokio::test]
async fn two_different_idempotency_keys_are_invalid_input_and_nothing_is_sent() {
    let (addr, rec) = support::start().await;
    let payload = json!({
        "method": "POST",
        "url": format!("http://{addr}/keyed200"),
        "headers": {"Idempotency-Key": "a", "idempotency-key": "b"},
    });
    let err = shield("")
        .wrap("api", HttpTool::new())
        .oneshot(http_tool_request("api", payload))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(rec.keys("/keyed200").is_empty(), "nothing was sent");

    // A payload header that disagrees with the request's own key: also refused.
    let req = ToolRequest::new(
        "api",
        json!({
            "method": "POST",
            "url": format!("http://{addr}/keyed200"),
            "headers": {"Idempotency-Key": "a"},
        }),
    )
    .kind(CallKind::Mutating)
    .idempotency_key("b");
    let err = HttpTool::new().oneshot(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(rec.keys("/keyed200").is_empty(), "nothing was sent");
}

#[tokio::test]
async fn one_key_under_two_spellings_is_sent_once() {
    let (addr, rec) = support::start().await;
    let payload = json!({
        "method": "POST",
        "url": format!("http://{addr}/keyed200"),
        "headers": {"Idempotency-Key": "k-1", "idempotency-key": "k-1"},
    });
    let req = http_tool_request("api", payload);
    assert_eq!(req.call_idempotency_key(), Some("k-1"));
    shield("")
        .wrap("api", HttpTool::new())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(rec.keys("/keyed200"), vec![vec!["k-1".to_owned()]]);
}

#[test]
fn a_raw_request_with_a_blank_or_ambiguous_key_header_has_no_key() {
    let req = |values: &[&str]| {
        let mut b = Request::builder().method(Method::POST).uri("http://x/");
        for v in values {
            b = b.header(IDEMPOTENCY_KEY_HEADER, *v);
        }
        b.body(()).unwrap()
    };
    assert_eq!(req(&["k"]).call_idempotency_key(), Some("k"));
    assert_eq!(req(&["k", "k"]).call_idempotency_key(), Some("k"));
    assert_eq!(req(&["  "]).call_idempotency_key(), None);
    assert_eq!(req(&["", "k"]).call_idempotency_key(), Some("k"));
    assert_eq!(req(&["a", "b"]).call_idempotency_key(), None);
}

#[tokio::test]
async fn a_raw_post_with_a_blank_key_is_sent_once() {
    let (addr, rec) = support::start().await;
    let retry = support::retry_now(3);
    let client = ServiceBuilder::new()
        .layer(BufferBodyLayer::default())
        .layer(retry)
        .layer(HttpErrorLayer::new())
        .service(hyper_client());
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}/keyed503"))
        .header(IDEMPOTENCY_KEY_HEADER, " ")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = client.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        rec.count("/keyed503"),
        1,
        "a blank key does not make it repeatable"
    );
}

#[tokio::test]
async fn a_408_or_425_is_retriable_and_keeps_its_retry_after() {
    let (addr, rec) = support::start().await;
    let err = HttpTool::new()
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/keyed425")}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert!(err.is_retriable());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));

    // 408 then 200: the shield retries it (its `Retry-After: 0` is honoured).
    let res = shield("")
        .wrap("api", HttpTool::new())
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/keyed408")}),
        ))
        .await
        .unwrap();
    assert_eq!(res.output["status"], 200);
    assert_eq!(res.provenance.attempts, 2);
    assert_eq!(rec.count("/keyed408"), 2);
}
