//! The generic layers around `toolshield_reqwest::Client`, against a real local server.

mod support;

use std::error::Error as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_core::{ErrorKind, ToolError};
use toolshield_retry::{BackoffStrategy, RetryConfig, RetryLayer};
use toolshield_timeout::TimeoutLayer;
use tower::{Service, ServiceBuilder, ServiceExt};

type Resp = http::Response<Bytes>;

fn retry(attempts: u32) -> RetryLayer {
    RetryLayer::from_config(&RetryConfig {
        max_attempts: attempts,
        backoff: BackoffStrategy::None,
        ..RetryConfig::default()
    })
    .unwrap()
    .without_budget()
}

fn registry(consecutive: u32) -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig {
        consecutive_failures: consecutive,
        ..BreakerConfig::default()
    })
    .unwrap()
}

/// retry > breaker > attempt timeout > reqwest.
fn stack(
    retry: RetryLayer,
    registry: BreakerRegistry,
    attempt_timeout: Duration,
) -> impl Service<Request<Bytes>, Response = Resp, Error = ToolError> + Clone {
    ServiceBuilder::new()
        .layer(retry)
        .layer(BreakerLayer::new(registry))
        .layer(TimeoutLayer::new(attempt_timeout))
        .service(toolshield_reqwest::Client::new(reqwest::Client::new()))
}

fn default_stack(
    attempts: u32,
) -> impl Service<Request<Bytes>, Response = Resp, Error = ToolError> + Clone {
    stack(retry(attempts), registry(10), Duration::from_secs(5))
}

fn req(method: Method, url: String, key: Option<&str>) -> Request<Bytes> {
    let mut b = Request::builder().method(method).uri(url);
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Bytes::from_static(b"{\"item\":\"book\"}")).unwrap()
}

fn get(url: String) -> Request<Bytes> {
    req(Method::GET, url, None)
}

#[tokio::test]
async fn two_503s_then_a_200_succeed_on_the_third_attempt() {
    let (addr, rec) = support::start().await;
    let res = default_stack(3)
        .oneshot(get(format!("http://{addr}/flaky")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.body(), &Bytes::from_static(b"recovered"));
    assert_eq!(
        res.extensions()
            .get::<toolshield_core::http_impls::HttpAttempts>(),
        Some(&toolshield_core::http_impls::HttpAttempts(3))
    );
    assert_eq!(rec.count("/flaky"), 3);
}

#[tokio::test]
async fn with_too_few_attempts_the_last_503_is_returned() {
    let (addr, rec) = support::start().await;
    let res = default_stack(2)
        .oneshot(get(format!("http://{addr}/flaky")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(rec.count("/flaky"), 2);
    let err = toolshield_reqwest::error_for_status(res).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
}

/// The gap between the first two requests to `path`.
fn gap(rec: &support::Recorder, path: &str) -> Duration {
    let times = rec.times(path);
    assert_eq!(times.len(), 2, "{path}: one 429, one retry");
    times[1] - times[0]
}

#[tokio::test]
async fn a_429_with_retry_after_in_seconds_waits_before_the_retry() {
    let (addr, rec) = support::start().await;
    let res = default_stack(3)
        .oneshot(get(format!("http://{addr}/limited-delta")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let gap = gap(&rec, "/limited-delta");
    // `Retry-After: 2`, not the 30 s default of a 429 without one, nor no wait at all.
    assert!(gap >= Duration::from_millis(1950), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(4), "retried after {gap:?}");
}

#[tokio::test]
async fn a_429_with_retry_after_as_an_http_date_waits_until_that_date() {
    let (addr, rec) = support::start().await;
    let res = default_stack(3)
        .oneshot(get(format!("http://{addr}/limited-date")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let gap = gap(&rec, "/limited-date");
    // The date is 3 s after the 429 was sent, cut to the whole second: a wait of
    // more than 2 s and at most 3 s.
    assert!(gap >= Duration::from_millis(1950), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(4), "retried after {gap:?}");
}

#[tokio::test]
async fn a_retry_after_longer_than_the_maximum_ends_the_call_with_rate_limited() {
    let (addr, rec) = support::start().await;
    for (path, exact) in [("/limited-long-delta", true), ("/limited-long-date", false)] {
        let svc = stack(
            retry(3).with_max_retry_after(Duration::from_secs(10)),
            registry(10),
            Duration::from_secs(5),
        );
        let started = Instant::now();
        let res = svc
            .oneshot(get(format!("http://{addr}{path}")))
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{path}: did not wait"
        );
        assert_eq!(rec.count(path), 1, "{path}: not retried");
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait = res
            .extensions()
            .get::<toolshield_reqwest::RetryAfter>()
            .expect("the response carries its Retry-After")
            .0;
        let err = toolshield_reqwest::error_for_status(res).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RateLimited, "{path}");
        assert_eq!(err.retry_after(), Some(wait), "{path}");
        if exact {
            assert_eq!(wait, Duration::from_secs(120));
        } else {
            assert!(
                wait > Duration::from_secs(115) && wait <= Duration::from_secs(120),
                "{path}: {wait:?}"
            );
        }
        assert!(
            err.for_model("api").contains("Wait 1"),
            "{}",
            err.for_model("api")
        );
    }
}

#[tokio::test]
async fn a_post_without_a_key_is_sent_once() {
    let (addr, rec) = support::start().await;
    let res = default_stack(3)
        .oneshot(req(Method::POST, format!("http://{addr}/post503"), None))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        rec.count("/post503"),
        1,
        "a POST without a key is never repeated"
    );
}

#[tokio::test]
async fn a_post_with_an_idempotency_key_is_retried_under_the_same_key() {
    let (addr, rec) = support::start().await;
    let res = default_stack(3)
        .oneshot(req(
            Method::POST,
            format!("http://{addr}/post503"),
            Some("order-2026-0001"),
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        rec.keys("/post503"),
        vec![vec!["order-2026-0001".to_owned()]; 3],
        "three attempts, each with the one key"
    );
}

#[tokio::test]
async fn a_blank_idempotency_key_is_no_key() {
    let (addr, rec) = support::start().await;
    default_stack(3)
        .oneshot(req(
            Method::POST,
            format!("http://{addr}/post503"),
            Some("  "),
        ))
        .await
        .unwrap();
    assert_eq!(rec.count("/post503"), 1);
}

#[tokio::test]
async fn a_slow_endpoint_is_cut_by_the_attempt_timeout() {
    let (addr, rec) = support::start().await;
    let started = Instant::now();
    let err = stack(retry(2), registry(10), Duration::from_millis(200))
        .oneshot(get(format!("http://{addr}/slow")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(rec.count("/slow"), 2, "a timed out GET is retried");
    assert_eq!(err.attempts(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn reqwests_own_timeout_is_timeout() {
    let (addr, _rec) = support::start().await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let err = toolshield_reqwest::Client::new(client)
        .oneshot(get(format!("http://{addr}/slow")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let source = err
        .source()
        .and_then(|s| s.downcast_ref::<reqwest::Error>());
    assert!(source.is_some_and(reqwest::Error::is_timeout), "{err:?}");
}

#[tokio::test]
async fn a_refused_connection_is_connection_failed_and_keeps_reqwests_error() {
    let addr = support::refusing_addr();
    let err = default_stack(1)
        .oneshot(get(format!("http://{addr}/?api_key=secret")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    let source = err
        .source()
        .and_then(|s| s.downcast_ref::<reqwest::Error>())
        .expect("the reqwest error is the source");
    assert!(source.is_connect());
    let url = source.url().expect("the url is kept");
    assert_eq!(url.port(), Some(addr.port()));
    assert_eq!(url.query(), None, "the query may hold secrets: removed");
    assert!(!format!("{err:?}").contains("secret"));
}

#[tokio::test]
async fn an_open_breaker_rejects_without_reaching_the_server() {
    let (addr, rec) = support::start().await;
    let reg = registry(3);
    let mut svc = stack(retry(1), reg.clone(), Duration::from_secs(5));
    for _ in 0..3 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(get(format!("http://{addr}/fail")))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(reg.state("127.0.0.1"), CircuitState::Open);
    for path in ["/fail", "/ok"] {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(get(format!("http://{addr}{path}")))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    }
    assert_eq!(rec.count("/fail"), 3, "the open breaker sent nothing");
    assert_eq!(rec.count("/ok"), 0, "the breaker is per host, not per path");
}

#[tokio::test]
async fn a_body_buffered_by_toolshield_http_is_resent_whole_on_every_attempt() {
    let (addr, rec) = support::start().await;
    // BufferBodyLayer collects any `http_body::Body` into a clonable `Full<Bytes>` first.
    let svc = ServiceBuilder::new()
        .layer(toolshield_http::BufferBodyLayer::default())
        .layer(retry(3))
        .service(toolshield_reqwest::Client::new(reqwest::Client::new()));
    let req = Request::post(format!("http://{addr}/post503"))
        .header("idempotency-key", "k-1")
        .body(String::from("streamed order"))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(rec.bodies("/post503"), vec![b"streamed order".to_vec(); 3]);
}
