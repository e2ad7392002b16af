//! The generic layers stacked straight onto hyper-util's client, as tower's own
//! middleware is: no `map_err`, no `HttpErrorLayer`. hyper's error type is another
//! crate's; the layers take it as tower does (`Into<BoxError>`) and classify it by what
//! it holds down its chain of sources.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use toolshield::cancel::CancelLayer;
use toolshield_breaker::{BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_core::{ErrorKind, ToolError};
use toolshield_http::hyper_client;
use toolshield_timeout::TimeoutLayer;
use tower::{Service, ServiceBuilder, ServiceExt};

type Resp = http::Response<hyper::body::Incoming>;

fn get(url: String) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::new(Bytes::new())).unwrap()
}

fn bare_stack(
    registry: BreakerRegistry,
) -> impl Service<Request<Full<Bytes>>, Response = Resp, Error = ToolError> + Clone {
    ServiceBuilder::new()
        .layer(CancelLayer::new())
        .layer(BreakerLayer::new(registry))
        .layer(TimeoutLayer::new(Duration::from_secs(5)))
        .service(hyper_client())
}

#[tokio::test]
async fn an_answer_passes_through_the_layers_on_a_bare_client() {
    let (addr, rec) = support::start().await;
    let res = bare_stack(support::registry(5))
        .oneshot(get(format!("http://{addr}/ok")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(rec.count("/ok"), 1);
}

#[tokio::test]
async fn a_refused_connection_is_connection_failed_and_opens_the_breaker() {
    let addr = support::refusing_addr();
    let reg = support::registry(2);
    let svc = bare_stack(reg.clone());
    for _ in 0..2 {
        let err = svc
            .clone()
            .oneshot(get(format!("http://{addr}/ok")))
            .await
            .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::ConnectionFailed,
            "hyper's connect error, classified by the io::Error it holds: {err}"
        );
        assert!(
            std::error::Error::source(&err).is_some(),
            "hyper's error is kept as the source"
        );
    }
    assert_eq!(reg.state("127.0.0.1"), CircuitState::Open);
    let err = svc
        .oneshot(get(format!("http://{addr}/ok")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
}

#[tokio::test]
async fn a_dropped_connection_is_an_error_that_is_not_retried_blindly() {
    let (addr, ran) = support::start_dropping().await;
    // The server read the request and dropped the connection without an answer: the
    // request may have taken effect, so the generic classification does not call it
    // retriable (HttpErrorLayer, which knows the method, may).
    let err = bare_stack(support::registry(5))
        .oneshot(get(format!("http://{addr}/anything")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed, "{err}");
    assert!(!err.kind().is_retriable());
    assert!(std::error::Error::source(&err).is_some());
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn tower_middleware_and_the_layers_stack_in_either_order_on_the_client() {
    let (addr, rec) = support::start().await;
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_secs(5)))
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(5)))
        .layer(BreakerLayer::new(support::registry(5)))
        .service(hyper_client());
    let res = svc.oneshot(get(format!("http://{addr}/ok"))).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(rec.count("/ok"), 1);
}
