//! The attempt timeout, the soft threshold and the deadline at their edges (zero, the
//! largest duration), around any tower service, with tokio's paused clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{BoxError, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::{service_fn, Layer, Service, ServiceExt};

fn instant_tool() -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = std::future::Ready<Result<ToolResponse, ToolError>>,
> + Clone {
    service_fn(|_req: ToolRequest| std::future::ready(Ok(ToolResponse::new(json!("now")))))
}

fn sleeper(
    d: Duration,
) -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone {
    service_fn(move |_req: ToolRequest| async move {
        tokio::time::sleep(d).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("done")))
    })
}

#[tokio::test(start_paused = true)]
async fn a_zero_attempt_timeout_lets_only_a_ready_answer_through() {
    let res = TimeoutLayer::new(Duration::ZERO)
        .layer(instant_tool())
        .oneshot(ToolRequest::new("t", json!({})))
        .await;
    assert!(res.is_ok(), "an answer ready at the first poll wins");

    let start = Instant::now();
    let e = TimeoutLayer::new(Duration::ZERO)
        .layer(sleeper(Duration::from_millis(1)))
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn duration_max_limits_never_panic_and_let_a_slow_call_finish() {
    let svc = DeadlineLayer::new(Duration::MAX).layer(
        TimeoutLayer::new(Duration::MAX)
            .soft_threshold(Duration::MAX)
            .idle(Duration::MAX)
            .layer(sleeper(Duration::from_secs(3600))),
    );
    let res = svc.oneshot(ToolRequest::new("t", json!({}))).await.unwrap();
    assert_eq!(res.output, json!("done"));
    assert!(!res.provenance.slow);
}

#[tokio::test(start_paused = true)]
async fn a_zero_soft_threshold_marks_every_success_slow() {
    let res = TimeoutLayer::new(Duration::from_secs(5))
        .soft_threshold(Duration::ZERO)
        .layer(instant_tool())
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .unwrap();
    assert!(
        res.provenance.slow,
        "documented: a zero soft threshold marks every success"
    );
}

#[tokio::test(start_paused = true)]
async fn the_soft_threshold_never_fails_a_call_and_never_marks_a_failure() {
    let res = TimeoutLayer::new(Duration::from_secs(10))
        .soft_threshold(Duration::from_secs(2))
        .layer(sleeper(Duration::from_secs(9)))
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .unwrap();
    assert!(res.provenance.slow);

    let failing = service_fn(|_req: ToolRequest| async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Err::<ToolResponse, _>(ToolError::new(ErrorKind::ConnectionFailed, "reset"))
    });
    let e = TimeoutLayer::new(Duration::from_secs(10))
        .soft_threshold(Duration::from_secs(2))
        .layer(failing)
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::ConnectionFailed,
        "passed through as it was"
    );
}

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_plain_service_with_box_errors_is_timed_out_and_its_future_dropped() {
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&dropped);
    let svc = service_fn(move |req: String| {
        let guard = DropFlag(Arc::clone(&flag));
        async move {
            let _guard = guard;
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, BoxError>(req)
        }
    });
    let mut svc = TimeoutLayer::new(Duration::from_secs(1)).layer(svc);
    let fut = svc.ready().await.unwrap().call(String::from("q"));
    let start = Instant::now();
    let e = fut.await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the inner future is dropped on expiry"
    );

    let ok = TimeoutLayer::new(Duration::from_secs(1))
        .layer(service_fn(
            |req: String| async move { Ok::<_, BoxError>(req) },
        ))
        .oneshot(String::from("fast"))
        .await
        .unwrap();
    assert_eq!(ok, "fast");
}

#[tokio::test(start_paused = true)]
async fn an_inner_towers_timeout_elapsed_is_reported_as_timeout() {
    let inner = tower::timeout::TimeoutLayer::new(Duration::from_secs(1)).layer(service_fn(
        |req: String| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, BoxError>(req)
        },
    ));
    let e = TimeoutLayer::new(Duration::from_secs(10))
        .layer(inner)
        .oneshot(String::from("q"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
}

#[derive(Clone)]
struct BrokenReadiness;

impl Service<String> for BrokenReadiness {
    type Response = String;
    type Error = BoxError;
    type Future = std::future::Ready<Result<String, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Err(Box::new(ToolError::new(
            ErrorKind::ConnectionFailed,
            "pool closed",
        ))))
    }

    fn call(&mut self, req: String) -> Self::Future {
        std::future::ready(Ok(req))
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_errors_pass_through_both_layers() {
    let mut t = TimeoutLayer::new(Duration::from_secs(1)).layer(BrokenReadiness);
    let e = std::future::poll_fn(|cx| t.poll_ready(cx))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
    let mut d = DeadlineLayer::new(Duration::from_secs(1)).layer(BrokenReadiness);
    let e = std::future::poll_fn(|cx| d.poll_ready(cx))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_every_attempt_and_wait_of_a_retried_call() {
    use toolshield_retry::{BackoffStrategy, RetryLayer};
    // Each attempt may take 4 s, the whole call 10 s, 1 s between attempts: attempts
    // start at 0 s and 5 s and are cut at 4 s and 9 s; a third would start at 10 s.
    let svc = DeadlineLayer::new(Duration::from_secs(10)).layer(
        RetryLayer::new(5)
            .without_budget()
            .with_backoff(BackoffStrategy::fixed_range(
                Duration::from_secs(1),
                Duration::from_secs(1),
            ))
            .layer(
                TimeoutLayer::new(Duration::from_secs(4)).layer(sleeper(Duration::from_secs(60))),
            ),
    );
    let start = Instant::now();
    let e = svc
        .oneshot(ToolRequest::new("t", json!({})).kind(toolshield_core::CallKind::ReadOnly))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(9),
        "no wait past the deadline"
    );
}
