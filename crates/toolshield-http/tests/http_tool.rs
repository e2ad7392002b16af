//! `HttpTool` under the full `Shield` stack, against a real axum server.

mod support;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_core::{CallKind, ErrorKind};
use toolshield_http::{http_tool_request, HttpTool};
use tower::ServiceExt;

#[tokio::test]
async fn the_payload_becomes_a_request_and_the_response_an_output() {
    let (addr, rec) = support::start().await;
    let res = HttpTool::new()
        .oneshot(http_tool_request(
            "api",
            json!({"method": "POST", "url": format!("http://{addr}/create"), "body": {"item": "book"}}),
        ))
        .await
        .unwrap();
    assert_eq!(res.output["status"], 201);
    assert_eq!(res.output["body"]["echo"], json!({"item": "book"}));
    assert_eq!(res.output["headers"]["content-type"], "application/json");
    assert_eq!(rec.count("/create"), 1);
}

#[test]
fn the_method_and_the_idempotency_key_header_shape_the_tool_request() {
    let get = http_tool_request("api", json!({"url": "http://x/"}));
    assert_eq!(get.call_kind(), CallKind::Idempotent);
    let post = http_tool_request(
        "api",
        json!({"method": "post", "url": "http://x/", "headers": {"Idempotency-Key": "k-1"}}),
    );
    assert_eq!(post.call_kind(), CallKind::Mutating);
    assert_eq!(post.get_idempotency_key(), Some("k-1"));
    let patch = http_tool_request("api", json!({"method": "PATCH", "url": "http://x/"}));
    assert_eq!(patch.call_kind(), CallKind::Mutating);
    assert_eq!(patch.get_idempotency_key(), None);
}

#[tokio::test]
async fn bad_payloads_are_invalid_input() {
    for payload in [
        json!({}),
        json!({"url": "/relative"}),
        json!({"url": "http://x/", "method": "GE T"}),
        json!({"url": "http://x/", "headers": {"x": 1}}),
    ] {
        let err = HttpTool::new()
            .oneshot(http_tool_request("api", payload.clone()))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{payload}");
    }
}

#[tokio::test]
async fn through_the_shield_a_503_is_retried_and_a_404_is_not() {
    let (addr, rec) = support::start().await;
    let api = support::shield().wrap("api", HttpTool::new());
    let ok = api
        .clone()
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/flaky")}),
        ))
        .await
        .unwrap();
    assert_eq!(ok.output["body"], "recovered");
    assert_eq!(ok.provenance.attempts, 2);
    assert_eq!(rec.count("/flaky"), 2);

    let err = api
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/missing")}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(rec.count("/missing"), 1);
}

#[tokio::test]
async fn a_429_carries_its_retry_after() {
    let (addr, _rec) = support::start().await;
    let err = HttpTool::new()
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/ratelimited")}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(std::time::Duration::from_secs(2)));
}

#[tokio::test]
async fn a_post_without_a_key_is_sent_once_when_keys_are_not_derived() {
    let (addr, rec) = support::start().await;
    // The recommended setting for HTTP tools: only the `Idempotency-Key` header makes a
    // POST repeatable (a derived key would dedupe locally, but the server cannot know it).
    let cfg = ShieldConfig::from_toml_str(
        r#"
        [defaults.retry]
        max_attempts = 3
        backoff = { strategy = "none" }
        [defaults.idempotency]
        derive_keys = false
        "#,
    )
    .unwrap();
    let api = Shield::from_config(cfg)
        .unwrap()
        .wrap("api", HttpTool::new());
    let err = api
        .oneshot(http_tool_request(
            "api",
            json!({"method": "POST", "url": format!("http://{addr}/post503")}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(rec.count("/post503"), 1);
}

#[tokio::test]
async fn a_post_with_a_key_sent_twice_at_once_runs_the_handler_once() {
    let (addr, rec) = support::start().await;
    let api = support::shield().wrap("api", HttpTool::new());
    let payload = json!({
        "method": "POST",
        "url": format!("http://{addr}/create"),
        "headers": {"Idempotency-Key": "order-42"},
        "body": {"item": "book"},
    });
    let (a, b) = tokio::join!(
        api.clone()
            .oneshot(http_tool_request("api", payload.clone())),
        api.clone()
            .oneshot(http_tool_request("api", payload.clone())),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(rec.count("/create"), 1, "the handler ran once");
    assert_eq!(a.output, b.output);
    assert!(
        a.provenance.replayed != b.provenance.replayed,
        "one of them is a replay"
    );
}

#[tokio::test]
async fn several_retry_after_headers_give_the_error_their_longest_wait() {
    let client = tower::service_fn(|_req: toolshield_http::BufferedRequest| async {
        let res = http::Response::builder()
            .status(429)
            .header(http::header::RETRY_AFTER, "1")
            .header(http::header::RETRY_AFTER, "7")
            .header(http::header::RETRY_AFTER, "not a wait")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        Ok::<_, std::convert::Infallible>(res)
    });
    let err = HttpTool::with_client(client)
        .oneshot(http_tool_request("api", json!({"url": "http://x/"})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(std::time::Duration::from_secs(7)));
}

#[tokio::test]
async fn a_rejected_url_is_not_echoed_in_the_error() {
    // A URL may carry credentials or an API key: the error (which reaches logs and the
    // model) says what is wrong without repeating it.
    for url in [
        "/relative?api_key=SECRET",
        "http://user:SECRET@/no-host",
        "ht tp://x/?token=SECRET",
    ] {
        let err = HttpTool::new()
            .oneshot(http_tool_request("api", json!({ "url": url })))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}");
        assert!(!err.to_string().contains("SECRET"), "{url}: {err}");
        assert!(!format!("{err:?}").contains("SECRET"), "{url}: {err:?}");
    }
}

type Buffered = http::Request<http_body_util::Full<bytes::Bytes>>;
type FullResponse = http::Response<http_body_util::Full<bytes::Bytes>>;
type Answer = std::future::Ready<Result<FullResponse, std::convert::Infallible>>;

/// A client answering every request with a 200 whose body is `len` bytes.
fn answering_bytes(
    len: usize,
) -> impl tower::Service<
    Buffered,
    Response = FullResponse,
    Error = std::convert::Infallible,
    Future = Answer,
> + Clone {
    tower::service_fn(move |_req: Buffered| {
        std::future::ready(Ok(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::from(vec![b'x'; len]),
        ))))
    })
}

#[tokio::test]
async fn a_mutation_answered_with_a_body_over_the_limit_is_outcome_unknown() {
    // The server ran the POST; only its answer is too large to read. `INVALID_INPUT`
    // would let the idempotency layer free the key after its short failure TTL, and a
    // repeat would run the mutation again.
    let post = json!({"method": "POST", "url": "http://api.test/orders", "body": {}});
    let err = HttpTool::with_client(answering_bytes(4096))
        .body_limit(1024)
        .oneshot(http_tool_request("api", post))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err:?}");
    // A read stays the caller's problem: nothing ran that a repeat could run twice.
    let get = json!({"url": "http://api.test/orders"});
    let err = HttpTool::with_client(answering_bytes(4096))
        .body_limit(1024)
        .oneshot(http_tool_request("api", get))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err:?}");
}

#[tokio::test]
async fn https_through_the_plain_http_client_is_invalid_input_and_not_retried() {
    // The default client has no TLS: the connector refuses the scheme before connecting,
    // which no retry fixes and which says nothing of the host's health.
    let (addr, rec) = support::start().await;
    let for_url = |url: String| http_tool_request("api", json!({ "url": url }));
    let err = tower::ServiceBuilder::new()
        .layer(support::retry_now(3))
        .service(HttpTool::new())
        .oneshot(for_url(format!("https://{addr}/ok")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err:?}");
    assert_eq!(err.attempts(), 1, "not retried");
    assert!(!err.kind().counts_for_breaker());
    assert!(!err.message().contains(&addr.to_string()), "{err}");
    assert_eq!(rec.count("/ok"), 0);
}

/// A `Set-Cookie` is the server's session credential for this client: the output reaches
/// the model, the logs and a shared cache (where another caller would be handed it), so
/// it is left out; the other headers stay, a repeated one joined by `, `.
#[tokio::test]
async fn a_set_cookie_never_reaches_the_output() {
    let client = tower::service_fn(|_req: Buffered| {
        let mut res = http::Response::new(http_body_util::Full::new(bytes::Bytes::from("ok")));
        let headers = res.headers_mut();
        headers.append(
            http::header::SET_COOKIE,
            "session=s3cr3t; HttpOnly".parse().unwrap(),
        );
        headers.append(http::header::SET_COOKIE, "theme=dark".parse().unwrap());
        headers.append("x-request-id", "r-1".parse().unwrap());
        headers.append(http::header::VARY, "accept".parse().unwrap());
        headers.append(http::header::VARY, "origin".parse().unwrap());
        std::future::ready(Ok::<_, std::convert::Infallible>(res))
    });
    let res = HttpTool::with_client(client)
        .oneshot(http_tool_request(
            "api",
            json!({"url": "http://api.test/me"}),
        ))
        .await
        .unwrap();
    let headers = res.output["headers"].as_object().expect("headers");
    assert!(
        headers
            .keys()
            .all(|k| !k.eq_ignore_ascii_case("set-cookie")),
        "{headers:?}"
    );
    assert!(!res.output.to_string().contains("s3cr3t"));
    assert_eq!(headers["x-request-id"], "r-1");
    assert_eq!(headers["vary"], "accept, origin");
}
