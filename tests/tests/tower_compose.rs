//! Every generic toolshield layer stacks with tower's own middleware (`Buffer`,
//! `ConcurrencyLimit`, `Timeout`, `LoadShed`) and tower-http's `TraceLayer`, in both
//! orders, with no `map_err`: over `ToolRequest`, over a plain `Service<String>` whose
//! error is tower's `BoxError`, and over `http::Request`. tower's errors come out
//! classified (`Elapsed` is `TIMEOUT`, `Overloaded` is `OVERLOADED`).

use std::fmt::Debug;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_breaker::BreakerLayer;
use toolshield_cancel::CancelLayer;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_fallback::FallbackLayer;
use toolshield_metrics::MetricsLayer;
use toolshield_retry::RetryLayer;
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::buffer::BufferLayer;
use tower::limit::ConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::timeout::TimeoutLayer as TowerTimeoutLayer;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_http::trace::TraceLayer;

async fn ok<S, Req>(svc: S, req: Req)
where
    S: Service<Req>,
    S::Error: Debug,
{
    svc.oneshot(req).await.expect("the composed stack answers");
}

fn tool() -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl Future<Output = Result<ToolResponse, ToolError>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!("ok"))) })
}

fn plain() -> impl Service<
    String,
    Response = String,
    Error = BoxError,
    Future = impl Future<Output = Result<String, BoxError>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(|q: String| async move { Ok::<_, BoxError>(format!("answer to {q}")) })
}

fn web() -> impl Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = BoxError,
    Future = impl Future<Output = Result<http::Response<String>, BoxError>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(|_req: http::Request<String>| async {
        Ok::<_, BoxError>(http::Response::new("ok".to_owned()))
    })
}

fn request() -> ToolRequest {
    ToolRequest::new("lookup", json!({"q": "rust"})).kind(toolshield_core::CallKind::ReadOnly)
}

fn web_request() -> http::Request<String> {
    http::Request::get("http://api.example.com/q")
        .body(String::new())
        .unwrap()
}

/// One of our layers (`$ours`) with one of tower's (`$theirs`), both orders, around the
/// three kinds of service.
macro_rules! both_orders {
    ($ours:expr, $theirs:expr) => {{
        ok(
            ServiceBuilder::new()
                .layer($ours)
                .layer($theirs)
                .service(tool()),
            request(),
        )
        .await;
        ok(
            ServiceBuilder::new()
                .layer($theirs)
                .layer($ours)
                .service(tool()),
            request(),
        )
        .await;
        ok(
            ServiceBuilder::new()
                .layer($ours)
                .layer($theirs)
                .service(plain()),
            "q".to_owned(),
        )
        .await;
        ok(
            ServiceBuilder::new()
                .layer($theirs)
                .layer($ours)
                .service(plain()),
            "q".to_owned(),
        )
        .await;
        ok(
            ServiceBuilder::new()
                .layer($ours)
                .layer($theirs)
                .service(web()),
            web_request(),
        )
        .await;
        ok(
            ServiceBuilder::new()
                .layer($theirs)
                .layer($ours)
                .service(web()),
            web_request(),
        )
        .await;
    }};
}

/// One of our layers with each of tower's, and with tower-http's `TraceLayer` (HTTP only).
macro_rules! with_every_tower_layer {
    ($ours:expr) => {{
        both_orders!($ours, BufferLayer::new(8));
        both_orders!($ours, ConcurrencyLimitLayer::new(4));
        both_orders!($ours, TowerTimeoutLayer::new(Duration::from_secs(1)));
        ok(
            ServiceBuilder::new()
                .layer($ours)
                .layer(TraceLayer::new_for_http())
                .service(web()),
            web_request(),
        )
        .await;
        ok(
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer($ours)
                .service(web()),
            web_request(),
        )
        .await;
    }};
}

#[tokio::test]
async fn timeout_and_deadline_compose_with_tower_in_both_orders() {
    with_every_tower_layer!(TimeoutLayer::new(Duration::from_secs(1)));
    with_every_tower_layer!(DeadlineLayer::new(Duration::from_secs(1)));
}

#[tokio::test]
async fn cancel_composes_with_tower_in_both_orders() {
    with_every_tower_layer!(CancelLayer::new());
}

#[tokio::test]
async fn retry_composes_with_tower_in_both_orders() {
    with_every_tower_layer!(RetryLayer::new(2));
}

#[tokio::test]
async fn breaker_composes_with_tower_in_both_orders() {
    let breaker = BreakerLayer::default();
    with_every_tower_layer!(breaker.clone());
}

#[tokio::test]
async fn metrics_compose_with_tower_in_both_orders() {
    let metrics = MetricsLayer::new(["lookup"]).unwrap();
    with_every_tower_layer!(metrics.clone());
}

#[tokio::test]
async fn fallback_composes_with_tower_in_both_orders() {
    with_every_tower_layer!(FallbackLayer::new());
}

#[tokio::test]
async fn fallback_hands_a_plain_request_to_the_next_tier() {
    let down = service_fn(|_q: String| async {
        Err::<String, BoxError>(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))
    });
    let mirror = service_fn(|q: String| async move { Ok::<_, BoxError>(format!("mirror: {q}")) });
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new().tier("mirror", mirror))
        .service(down);
    assert_eq!(svc.oneshot("q".to_owned()).await.unwrap(), "mirror: q");
}

#[tokio::test(start_paused = true)]
async fn tower_timeouts_are_timeouts_and_are_retried() {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&calls);
    let slow_once = service_fn(move |q: String| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Ok::<_, BoxError>(q)
        }
    });
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(2))
        .layer(TowerTimeoutLayer::new(Duration::from_secs(1)))
        .service(slow_once);
    assert_eq!(svc.oneshot("q".to_owned()).await.unwrap(), "q");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "tower's Elapsed was retried as TIMEOUT"
    );

    let never = service_fn(|_q: String| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<_, BoxError>(String::new())
    });
    let err = ServiceBuilder::new()
        .layer(BreakerLayer::default())
        .layer(TowerTimeoutLayer::new(Duration::from_secs(1)))
        .service(never)
        .oneshot("q".to_owned())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
}

#[tokio::test]
async fn a_tool_error_boxed_by_buffer_comes_back_unchanged() {
    let limited = service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::rate_limited(
            "slow down",
            Some(Duration::from_secs(7)),
        ))
    });
    let err = ServiceBuilder::new()
        .layer(BreakerLayer::default())
        .layer(BufferLayer::new(4))
        .service(limited)
        .oneshot(request())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
}

#[tokio::test]
async fn load_shedding_is_overloaded_and_not_a_breaker_failure() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = Arc::clone(&gate);
    let stuck = service_fn(move |q: String| {
        let held = Arc::clone(&held);
        async move {
            let _permit = held.acquire().await;
            Ok::<_, BoxError>(q)
        }
    });
    let breaker = BreakerLayer::default();
    let registry = breaker.registry().clone();
    let mut svc = ServiceBuilder::new()
        .layer(breaker)
        .layer(LoadShedLayer::new())
        .layer(ConcurrencyLimitLayer::new(1))
        .service(stuck);
    // The first call takes the only slot and waits.
    let first = tokio::spawn(svc.ready().await.unwrap().call("a".to_owned()));
    tokio::task::yield_now().await;
    let mut codes = Vec::new();
    for _ in 0..6 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call("b".to_owned())
            .await
            .unwrap_err();
        codes.push(err.kind());
    }
    assert!(
        codes.iter().all(|k| *k == ErrorKind::Overloaded),
        "{codes:?}"
    );
    assert!(ErrorKind::Overloaded.is_retriable());
    let status = registry
        .status(toolshield_breaker::UNNAMED_KEY)
        .expect("a breaker");
    assert_eq!(
        status.failures_in_window, 0,
        "a local rejection says nothing of the tool"
    );
    gate.add_permits(1);
    first.await.unwrap().unwrap();
}
