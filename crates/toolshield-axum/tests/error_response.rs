//! `ToolErrorResponseLayer`, `status_for` and `error_response`: the status, headers and
//! body of every error kind, and the layer on a real axum server (127.0.0.1:0, a real HTTP
//! client) under a breaker and a timeout.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use serde_json::Value;
use toolshield_axum::{
    error_response, status_for, HandlerClassifier, MatchedPathKey, ToolErrorResponseLayer,
};
use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_core::{Classify, ErrorKind, Outcome, ToolError};
use toolshield_timeout::TimeoutLayer;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

use support::{request, serve};

/// The table of `docs/axum.md`, written out independently of `status_for`.
fn expected_status(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::Timeout => 504,
        ErrorKind::RateLimited => 429,
        ErrorKind::CircuitOpen => 503,
        ErrorKind::Cancelled => 503,
        ErrorKind::InvalidInput => 400,
        ErrorKind::Unauthorized => 401,
        ErrorKind::NotFound => 404,
        ErrorKind::ConnectionFailed => 502,
        ErrorKind::UpstreamUnavailable => 503,
        ErrorKind::ExecutionFailed => 500,
        ErrorKind::InProgress => 409,
        ErrorKind::IdempotencyKeyReused => 422,
        ErrorKind::OutcomeUnknown => 500,
        ErrorKind::StoreUnavailable => 503,
        ErrorKind::Internal => 500,
        ErrorKind::Overloaded => 503,
        ErrorKind::BudgetExhausted => 403,
        other => panic!("no expected status for {other}: add it to this table and docs/axum.md"),
    }
}

async fn body_json(response: Response<Body>) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

#[tokio::test]
async fn every_kind_has_its_status_and_a_json_body() {
    for kind in ErrorKind::ALL {
        let status = expected_status(kind);
        assert_eq!(status_for(kind).as_u16(), status, "{kind}");

        let error = ToolError::new(kind, "db at 10.0.0.7 said: secret detail");
        let response = error_response(&error);
        assert_eq!(response.status().as_u16(), status, "{kind}");
        assert_eq!(
            response.headers()["content-type"],
            "application/json",
            "{kind}"
        );
        assert!(
            response.headers().get("retry-after").is_none(),
            "{kind}: no retry_after, no Retry-After"
        );
        let body = body_json(response).await;
        let fields: Vec<&String> = body["error"].as_object().unwrap().keys().collect();
        assert_eq!(fields, ["code", "message", "retriable"], "{kind}");
        assert_eq!(body["error"]["code"], kind.code(), "{kind}");
        assert_eq!(body["error"]["retriable"], kind.is_retriable(), "{kind}");
        let message = body["error"]["message"].as_str().unwrap();
        match kind {
            ErrorKind::Internal => assert_eq!(message, "internal error"),
            ErrorKind::OutcomeUnknown => {
                assert!(!message.contains("secret"), "{message}");
                assert!(
                    message.contains("may or may not have taken effect"),
                    "{message}"
                );
            }
            _ => assert_eq!(message, "db at 10.0.0.7 said: secret detail", "{kind}"),
        }
    }
}

#[test]
fn retry_after_is_whole_seconds_rounded_up_on_429_and_503_only() {
    let wait = Duration::from_millis(6_500);
    let cases = [
        (ErrorKind::RateLimited, Some("7")),
        (ErrorKind::CircuitOpen, Some("7")),
        (ErrorKind::UpstreamUnavailable, Some("7")),
        (ErrorKind::StoreUnavailable, Some("7")),
        // A retry_after on a status where Retry-After means nothing is not sent.
        (ErrorKind::Timeout, None),
        (ErrorKind::ExecutionFailed, None),
        (ErrorKind::InvalidInput, None),
    ];
    for (kind, expected) in cases {
        let response = error_response(&ToolError::new(kind, "x").with_retry_after(wait));
        let header = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap());
        assert_eq!(header, expected, "{kind}");
    }
    let whole = error_response(&ToolError::rate_limited("x", Some(Duration::from_secs(2))));
    assert_eq!(whole.headers()["retry-after"], "2");
    let tiny = error_response(&ToolError::rate_limited(
        "x",
        Some(Duration::from_millis(1)),
    ));
    assert_eq!(tiny.headers()["retry-after"], "1");
}

#[tokio::test]
async fn the_layer_answers_errors_and_passes_responses_through() {
    let layer = ToolErrorResponseLayer::new();
    let failing = layer.layer(service_fn(|_req: Request<Body>| async {
        Err::<Response<Body>, _>(ToolError::rate_limited(
            "too many calls",
            Some(Duration::from_millis(2_100)),
        ))
    }));
    let response = failing.oneshot(Request::new(Body::empty())).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "3");
    let body = body_json(response).await;
    assert_eq!(body["error"]["code"], "RATE_LIMITED");
    assert_eq!(body["error"]["message"], "too many calls");
    assert_eq!(body["error"]["retriable"], true);

    // A handler's own response, error statuses included, is not touched.
    let teapot = layer.layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, ToolError>((
            StatusCode::IM_A_TEAPOT,
            [("x-handler", "yes")],
            "short and stout",
        ))
    }));
    let response = teapot.oneshot(Request::new(Body::empty())).await.unwrap();
    assert_eq!(response.status(), StatusCode::IM_A_TEAPOT);
    assert_eq!(response.headers()["x-handler"], "yes");
    let bytes = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(&bytes[..], b"short and stout");
}

/// A service whose readiness fails once, counting the calls that reach it.
#[derive(Clone)]
struct NotReadyOnce {
    failed: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
}

impl Service<Request<Body>> for NotReadyOnce {
    type Response = Response<Body>;
    type Error = ToolError;
    type Future = std::future::Ready<Result<Response<Body>, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        if self.failed.fetch_add(1, Ordering::SeqCst) == 0 {
            Poll::Ready(Err(ToolError::new(
                ErrorKind::StoreUnavailable,
                "store down",
            )))
        } else {
            Poll::Ready(Ok(()))
        }
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new(Body::from("ok"))))
    }
}

#[tokio::test]
async fn a_readiness_error_is_answered_by_the_next_call_without_reaching_the_service() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = ToolErrorResponseLayer::new().layer(NotReadyOnce {
        failed: Arc::new(AtomicU32::new(0)),
        calls: Arc::clone(&calls),
    });
    let first = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(Body::empty()))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body_json(first).await["error"]["code"], "STORE_UNAVAILABLE");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the inner service was not called"
    );

    let second = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(Body::empty()))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn the_handler_classifier_counts_5xx_and_errors_never_4xx() {
    let respond = |status: u16| -> Result<Response<()>, ToolError> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok(r)
    };
    let c = HandlerClassifier;
    assert_eq!(c.classify(&respond(200)), Outcome::Success);
    assert_eq!(c.classify(&respond(304)), Outcome::Success);
    for status in [400, 401, 403, 404, 409, 422, 429] {
        assert_eq!(c.classify(&respond(status)), Outcome::Ignored, "{status}");
    }
    for (status, kind) in [
        (500, ErrorKind::ExecutionFailed),
        (502, ErrorKind::UpstreamUnavailable),
        (503, ErrorKind::UpstreamUnavailable),
    ] {
        let outcome = c.classify(&respond(status));
        assert!(outcome.counts_as_failure(), "{status}");
        assert_eq!(outcome.kind(), Some(kind), "{status}");
    }
    let timeout: Result<Response<()>, _> = Err(ToolError::timeout("attempt timed out"));
    assert!(c.classify(&timeout).counts_as_failure());
    let invalid: Result<Response<()>, _> = Err(ToolError::invalid_input("bad"));
    assert_eq!(c.classify(&invalid), Outcome::Ignored);
}

/// The app of the server tests: every route behind
/// `ToolErrorResponseLayer > breaker (per route) > timeout (100 ms)`.
fn app(registry: &BreakerRegistry, flaky_failures: Arc<AtomicU32>) -> Router {
    let breaker = BreakerLayer::new(registry.clone())
        .key_fn(MatchedPathKey)
        .classifier(HandlerClassifier);
    Router::new()
        .route(
            "/flaky",
            get(move || {
                let left = Arc::clone(&flaky_failures);
                async move {
                    // Fails while failures are left, then recovers.
                    let failing = left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if failing {
                        (StatusCode::INTERNAL_SERVER_ERROR, "database down")
                    } else {
                        (StatusCode::OK, "fine")
                    }
                }
            }),
        )
        .route("/ok", get(|| async { "fine" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                "late"
            }),
        )
        .route(
            "/login",
            get(|| async { (StatusCode::UNAUTHORIZED, "bad token") }),
        )
        .route_layer(
            ServiceBuilder::new()
                .layer(ToolErrorResponseLayer::new())
                .layer(breaker)
                .layer(TimeoutLayer::new(Duration::from_millis(100))),
        )
}

fn open_after(failures: u32, open_wait: Duration) -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig {
        consecutive_failures: failures,
        open_wait,
        ..BreakerConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_opens_its_breaker_and_clients_get_503_with_retry_after() {
    let registry = open_after(3, Duration::from_secs(30));
    let addr = serve(app(&registry, Arc::new(AtomicU32::new(u32::MAX)))).await;
    let flaky = format!("http://{addr}/flaky");

    for i in 0..3 {
        let a = request("GET", flaky.clone(), None).await;
        assert_eq!(a.status, 500, "call {i}: the handler's own answer");
        assert_eq!(a.body, "database down");
    }
    assert_eq!(registry.state("/flaky"), CircuitState::Open);

    let a = request("GET", flaky.clone(), None).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.content_type, "application/json");
    // The wait left of 30 s, in whole seconds rounded up.
    let retry_after: u64 = a.retry_after.as_deref().unwrap().parse().unwrap();
    assert!(
        (29..=30).contains(&retry_after),
        "Retry-After: {retry_after}"
    );
    let body = a.json();
    assert_eq!(body["error"]["code"], "CIRCUIT_OPEN");
    assert_eq!(body["error"]["message"], "circuit open for `/flaky`");
    assert_eq!(body["error"]["retriable"], false);

    // One breaker per route: the other routes behind the same layer still answer.
    let a = request("GET", format!("http://{addr}/ok"), None).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body, "fine");
    assert_eq!(registry.state("/ok"), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_lets_a_probe_through_after_its_wait_and_closes() {
    let registry = open_after(2, Duration::from_millis(150));
    let addr = serve(app(&registry, Arc::new(AtomicU32::new(2)))).await;
    let flaky = format!("http://{addr}/flaky");
    for _ in 0..2 {
        assert_eq!(request("GET", flaky.clone(), None).await.status, 500);
    }
    let rejected = request("GET", flaky.clone(), None).await;
    assert_eq!(rejected.status, 503);
    assert_eq!(
        rejected.retry_after.as_deref(),
        Some("1"),
        "150 ms rounds up to 1 s"
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    let probe = request("GET", flaky.clone(), None).await;
    assert_eq!(
        probe.status, 200,
        "the handler recovered: the probe succeeds"
    );
    assert_eq!(registry.state("/flaky"), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_is_cut_at_the_timeout_with_504() {
    let registry = open_after(5, Duration::from_secs(30));
    let addr = serve(app(&registry, Arc::new(AtomicU32::new(0)))).await;
    let started = Instant::now();
    let a = request("GET", format!("http://{addr}/slow"), None).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(a.status, 504);
    assert_eq!(a.content_type, "application/json");
    assert_eq!(a.retry_after, None);
    let body = a.json();
    assert_eq!(body["error"]["code"], "TIMEOUT");
    assert_eq!(body["error"]["retriable"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_never_open_a_handlers_breaker() {
    let registry = open_after(3, Duration::from_secs(30));
    let addr = serve(app(&registry, Arc::new(AtomicU32::new(0)))).await;
    for _ in 0..6 {
        let a = request("GET", format!("http://{addr}/login"), None).await;
        assert_eq!(a.status, 401, "the handler's answer, never CIRCUIT_OPEN");
    }
    assert_eq!(registry.state("/login"), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_also_fits_router_layer() {
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                "late"
            }),
        )
        .layer(
            ServiceBuilder::new()
                .layer(ToolErrorResponseLayer::new())
                .layer(TimeoutLayer::new(Duration::from_millis(100))),
        );
    let addr = serve(app).await;
    let a = request("GET", format!("http://{addr}/slow"), None).await;
    assert_eq!(a.status, 504);
    assert_eq!(a.json()["error"]["code"], "TIMEOUT");
    // Routing itself answers inside the layer: an unknown path is still axum's 404.
    let a = request("GET", format!("http://{addr}/nowhere"), None).await;
    assert_eq!(a.status, 404);
}

// The service is infallible and Clone, as axum requires of a route layer's service.
#[allow(dead_code)]
fn assert_axum_bounds() {
    fn infallible<S>(_: &S)
    where
        S: Service<Request<Body>, Error = Infallible> + Clone + Send + Sync + 'static,
        S::Future: Send,
    {
    }
    let svc = ToolErrorResponseLayer::new().layer(TimeoutLayer::new(Duration::from_secs(1)).layer(
        service_fn(|_req: Request<Body>| async {
            Ok::<_, ToolError>(Response::new(Body::empty()))
        }),
    ));
    infallible(&svc);
}
