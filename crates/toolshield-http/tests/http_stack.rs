//! The generic layers around a real hyper client, against a real axum server.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use toolshield_breaker::{BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_core::{ErrorKind, ToolError};
use toolshield_http::{hyper_client, BufferBodyLayer, HttpErrorLayer};
use toolshield_timeout::TimeoutLayer;
use tower::{Service, ServiceBuilder, ServiceExt};

type Resp = http::Response<hyper::body::Incoming>;

/// buffer > retry > breaker > attempt timeout > errors > hyper client.
fn stack(
    registry: BreakerRegistry,
    attempts: u32,
) -> impl Service<Request<Full<Bytes>>, Response = Resp, Error = ToolError> + Clone {
    let retry = support::retry_now(attempts);
    ServiceBuilder::new()
        .layer(BufferBodyLayer::default())
        .layer(retry)
        .layer(BreakerLayer::new(registry))
        .layer(TimeoutLayer::new(Duration::from_secs(5)))
        .layer(HttpErrorLayer::new())
        .service(hyper_client())
}

fn req(method: Method, url: String, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(url);
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Full::new(Bytes::from_static(b"{}"))).unwrap()
}

#[tokio::test]
async fn a_503_then_200_is_retried_and_succeeds() {
    let (addr, rec) = support::start().await;
    let svc = stack(support::registry(5), 3);
    let res = svc
        .oneshot(req(Method::GET, format!("http://{addr}/flaky"), None))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(rec.count("/flaky"), 2);
}

#[tokio::test]
async fn a_429_with_retry_after_waits_before_the_retry() {
    let (addr, rec) = support::start().await;
    let svc = stack(support::registry(5), 3);
    let res = svc
        .oneshot(req(Method::GET, format!("http://{addr}/ratelimited"), None))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let times = rec.times("/ratelimited");
    assert_eq!(times.len(), 2);
    let gap = times[1] - times[0];
    // `Retry-After: 2` is honoured: the retry reached the server about 2 s later.
    assert!(gap >= Duration::from_millis(1950), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(4), "retried after {gap:?}");
}

#[tokio::test]
async fn client_errors_return_at_once_and_are_not_counted() {
    let (addr, rec) = support::start().await;
    let reg = support::registry(2);
    let mut svc = stack(reg.clone(), 3);
    for path in ["/bad", "/missing"] {
        for _ in 0..5 {
            let started = Instant::now();
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(req(Method::GET, format!("http://{addr}{path}"), None))
                .await
                .unwrap();
            assert!(res.status().is_client_error());
            assert!(started.elapsed() < Duration::from_secs(1));
        }
    }
    // one request per call: never retried
    assert_eq!(rec.count("/bad"), 5);
    assert_eq!(rec.count("/missing"), 5);
    // ten client errors against a breaker that trips after two failures: still closed
    assert_eq!(reg.state("127.0.0.1"), CircuitState::Closed);
}

#[tokio::test]
async fn a_failing_host_opens_its_breaker_while_another_host_stays_closed() {
    let (addr, rec) = support::start().await;
    let port = addr.port();
    let reg = support::registry(3);
    let mut svc = stack(reg.clone(), 1);
    for _ in 0..3 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(req(
                Method::GET,
                format!("http://127.0.0.1:{port}/fail"),
                None,
            ))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(reg.state("127.0.0.1"), CircuitState::Open);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(req(
            Method::GET,
            format!("http://127.0.0.1:{port}/fail"),
            None,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(rec.count("/fail"), 3, "the open breaker sent nothing");

    // The same server under another host name has its own, closed, breaker.
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(req(
            Method::GET,
            format!("http://localhost:{port}/ok"),
            None,
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(reg.state("localhost"), CircuitState::Closed);
}

#[tokio::test]
async fn post_is_retried_only_with_an_idempotency_key() {
    let (addr, rec) = support::start().await;
    let url = format!("http://{addr}/post503");
    let res = stack(support::registry(10), 3)
        .oneshot(req(Method::POST, url.clone(), None))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        rec.count("/post503"),
        1,
        "a POST without a key is never repeated"
    );

    let res = stack(support::registry(10), 3)
        .oneshot(req(Method::POST, url, Some("order-1")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(rec.count("/post503"), 4, "with a key: three attempts");
}

#[tokio::test]
async fn a_refused_connection_is_connection_failed() {
    // Bind, note the port, close: nothing listens there any more.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let err = stack(support::registry(10), 1)
        .oneshot(req(Method::GET, format!("http://127.0.0.1:{port}/"), None))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    assert!(
        std::error::Error::source(&err).is_some(),
        "keeps the client's error"
    );
}
