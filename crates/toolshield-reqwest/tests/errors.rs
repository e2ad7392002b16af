//! What `toolshield_reqwest::Client` answers when a request fails on the wire.

mod support;

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use toolshield_core::ErrorKind;
use toolshield_retry::{BackoffStrategy, RetryConfig, RetryLayer};
use tower::{ServiceBuilder, ServiceExt};

fn client() -> toolshield_reqwest::Client {
    toolshield_reqwest::Client::new(reqwest::Client::new())
}

#[tokio::test]
async fn a_post_whose_connection_is_lost_after_sending_is_outcome_unknown() {
    let (addr, received) = support::start_hanging_up().await;
    let req = Request::post(format!("http://{addr}/orders"))
        .header("idempotency-key", "order-1")
        .body(String::from("{}"))
        .unwrap();
    let retry = RetryLayer::from_config(&RetryConfig {
        backoff: BackoffStrategy::None,
        ..RetryConfig::default()
    })
    .unwrap()
    .without_budget();
    let err = ServiceBuilder::new()
        .layer(retry)
        .service(client())
        .oneshot(req)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(
        received.load(Ordering::SeqCst),
        1,
        "the server got it once: an unknown outcome is never retried, even with a key"
    );
}

#[tokio::test]
async fn a_get_whose_connection_is_lost_is_upstream_unavailable_and_retried() {
    let (addr, received) = support::start_hanging_up().await;
    let retry = RetryLayer::from_config(&RetryConfig {
        backoff: BackoffStrategy::None,
        ..RetryConfig::default()
    })
    .unwrap()
    .without_budget();
    let err = ServiceBuilder::new()
        .layer(retry)
        .service(client())
        .oneshot(
            Request::get(format!("http://{addr}/"))
                .body(Bytes::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(err.attempts(), 3);
    assert_eq!(received.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_url_reqwest_cannot_send_to_is_invalid_input() {
    for uri in ["/relative", "ftp://127.0.0.1/file"] {
        let err = client()
            .oneshot(Request::get(uri).body(Bytes::new()).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{uri}");
        assert!(!err.kind().is_retriable(), "{uri}");
    }
}

#[tokio::test]
async fn a_response_body_over_the_limit_is_invalid_input() {
    let (addr, _rec) = support::start().await;
    let url = format!("http://{addr}/big");
    let err = client()
        .body_limit(1024)
        .oneshot(Request::get(&url).body(Bytes::new()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let res = client()
        .oneshot(Request::get(&url).body(Bytes::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.body().len(), 4096);
}

#[tokio::test]
async fn every_in_memory_body_type_is_sent() {
    let (addr, rec) = support::start().await;
    let url = format!("http://{addr}/echo");
    let c = client();
    let post = || Request::builder().method(Method::POST).uri(&url);
    c.clone()
        .oneshot(post().body(Bytes::from_static(b"a")).unwrap())
        .await
        .unwrap();
    c.clone()
        .oneshot(post().body(String::from("b")).unwrap())
        .await
        .unwrap();
    c.clone()
        .oneshot(post().body(b"c".to_vec()).unwrap())
        .await
        .unwrap();
    c.clone().oneshot(post().body("d").unwrap()).await.unwrap();
    c.clone()
        .oneshot(post().body(Full::new(Bytes::from_static(b"e"))).unwrap())
        .await
        .unwrap();
    c.oneshot(post().body(reqwest::Body::from("f")).unwrap())
        .await
        .unwrap();
    let bodies: Vec<Vec<u8>> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|b| b.as_bytes().to_vec())
        .collect();
    assert_eq!(rec.bodies("/echo"), bodies);
}

#[tokio::test]
async fn a_redirect_loop_is_execution_failed_and_a_posts_outcome_unknown() {
    let (addr, rec) = support::start().await;
    let reqwest_client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::limited(2))
        .build()
        .unwrap();
    let client = toolshield_reqwest::Client::new(reqwest_client);
    let err = client
        .clone()
        .oneshot(
            Request::get(format!("http://{addr}/loop"))
                .body(Bytes::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed);
    assert!(!err.kind().is_retriable());
    assert_eq!(rec.count("/loop"), 3, "the request and two redirects");
    let err = client
        .oneshot(
            Request::post(format!("http://{addr}/loop"))
                .body(Bytes::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::OutcomeUnknown,
        "the first hop of a POST may have been executed"
    );
}

#[tokio::test]
async fn https_without_a_tls_backend_is_invalid_input_and_says_what_to_enable() {
    // The workspace builds reqwest without TLS: the connector refuses `https://`.
    let (addr, rec) = support::start().await;
    let retry = RetryLayer::from_config(&RetryConfig::default())
        .unwrap()
        .without_budget();
    let err = ServiceBuilder::new()
        .layer(retry)
        .service(client())
        .oneshot(
            Request::get(format!("https://{addr}/"))
                .body(Bytes::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err:?}");
    assert_eq!(err.attempts(), 1, "not retried");
    assert!(err.message().contains("rustls-tls"), "{err}");
    assert_eq!(rec.count("/"), 0);
}

#[test]
fn several_retry_after_headers_give_error_for_status_their_longest_wait() {
    let res = http::Response::builder()
        .status(503)
        .header(http::header::RETRY_AFTER, "0")
        .header(http::header::RETRY_AFTER, "30")
        .header(http::header::RETRY_AFTER, "-1")
        .body(Bytes::new())
        .unwrap();
    let err = toolshield_reqwest::error_for_status(res).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(err.retry_after(), Some(std::time::Duration::from_secs(30)));
}

#[tokio::test]
async fn a_post_answered_with_a_body_over_the_limit_is_outcome_unknown() {
    // The server ran the POST and answered 200; only its answer could not be read. Not
    // `INVALID_INPUT`: that would let the idempotency layer free the key after its short
    // failure TTL, and a repeat would run the mutation again.
    let (addr, rec) = support::start().await;
    let err = client()
        .body_limit(1024)
        .oneshot(
            Request::post(format!("http://{addr}/big"))
                .body(Bytes::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err:?}");
    assert!(!err.kind().is_retriable());
    assert_eq!(rec.count("/big"), 1);
}

#[tokio::test]
async fn an_error_status_with_a_body_over_the_limit_keeps_its_status_and_retry_after() {
    let (addr, _rec) = support::start().await;
    for (path, status, wait) in [("/big503", 503, 7), ("/big429", 429, 9)] {
        for method in [Method::GET, Method::POST] {
            let res = client()
                .body_limit(1024)
                .oneshot(
                    Request::builder()
                        .method(method.clone())
                        .uri(format!("http://{addr}{path}"))
                        .body(Bytes::new())
                        .unwrap(),
                )
                .await
                .unwrap_or_else(|e| panic!("{method} {path}: {e:?}"));
            assert_eq!(res.status().as_u16(), status, "{method} {path}");
            assert!(res.body().len() <= 1024, "{method} {path}: the body is cut");
            let err = toolshield_reqwest::error_for_status(res).unwrap_err();
            assert_eq!(
                err.retry_after(),
                Some(std::time::Duration::from_secs(wait)),
                "{method} {path}"
            );
        }
    }
}
