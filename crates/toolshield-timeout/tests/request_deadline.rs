//! A deadline carried by the request is enforced by the attempt timeout, with or without
//! a total deadline configured.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_retry::RetryLayer;
use toolshield_timeout::TimeoutLayer;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};

/// A tool that never answers, counting its calls.
fn hung(
    calls: Arc<AtomicU32>,
) -> impl tower::Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone {
    service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<ToolResponse, ToolError>>()
    })
}

fn read(deadline: Instant) -> ToolRequest {
    ToolRequest::new("search", json!({"q": "x"}))
        .kind(CallKind::ReadOnly)
        .deadline(deadline)
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_ends_a_hung_call_through_retry_and_attempt_timeout() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::default())
        .layer(TimeoutLayer::new(Duration::from_secs(30)))
        .service(hung(calls.clone()));
    let start = Instant::now();
    let e = svc
        .oneshot(read(start + Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(1),
        "ended at the deadline"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no retry with no time left"
    );
}

/// A hung call through an attempt timeout of `attempt`, its request's deadline
/// `deadline` from now: the error, and how long it took to come.
async fn cut(attempt: Duration, deadline: Duration) -> (ToolError, Duration) {
    let svc = TimeoutLayer::new(attempt).layer(hung(Arc::new(AtomicU32::new(0))));
    let start = Instant::now();
    let e = svc.oneshot(read(start + deadline)).await.unwrap_err();
    (e, start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn the_attempt_timeout_still_applies_before_a_later_request_deadline() {
    let (e, took) = cut(Duration::from_secs(2), Duration::from_secs(60)).await;
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(took, Duration::from_secs(2));
    assert!(e.message().contains("attempt exceeded 2s"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_deadline_passed_never_reaches_the_tool() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = TimeoutLayer::new(Duration::from_secs(30)).layer(hung(calls.clone()));
    let start = Instant::now();
    tokio::time::advance(Duration::from_secs(1)).await;
    let e = svc.oneshot(read(start)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn an_earlier_request_deadline_cuts_the_attempt_and_says_so() {
    let (e, took) = cut(Duration::from_secs(30), Duration::from_millis(1500)).await;
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(took, Duration::from_millis(1500));
    assert!(e.message().contains("reached its deadline"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_total_deadline_cut_short_by_the_requests_deadline_says_so() {
    let svc = toolshield_timeout::DeadlineLayer::new(Duration::from_secs(30))
        .layer(hung(Arc::new(AtomicU32::new(0))));
    let start = Instant::now();
    let e = svc
        .oneshot(read(start + Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(
        !e.message().contains("30s"),
        "cut at the request's deadline, not the 30 s budget: {e}"
    );
    assert!(e.message().contains("reached its deadline"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_call_rejected_for_a_passed_deadline_cancels_no_attempt_token() {
    // Both layers refuse a request whose deadline has passed without calling the tool;
    // neither cancels the attempt token that no attempt used (the caller's clones of
    // the request share it, and a later send with a new deadline would start cancelled).
    let start = Instant::now();
    tokio::time::advance(Duration::from_secs(1)).await;
    let calls = Arc::new(AtomicU32::new(0));
    let deadline =
        toolshield_timeout::DeadlineLayer::new(Duration::from_secs(30)).layer(hung(calls.clone()));
    let timeout = TimeoutLayer::new(Duration::from_secs(30)).layer(hung(calls.clone()));
    for (name, err) in [
        ("deadline", {
            let req = read(start);
            let kept = req.clone();
            let e = deadline.clone().oneshot(req).await.unwrap_err();
            (e, kept)
        }),
        ("timeout", {
            let req = read(start);
            let kept = req.clone();
            let e = timeout.clone().oneshot(req).await.unwrap_err();
            (e, kept)
        }),
    ] {
        let (e, kept) = err;
        assert_eq!(e.kind(), ErrorKind::Timeout, "{name}: {e}");
        assert!(
            !kept.attempt_token().is_cancelled(),
            "{name}: the attempt token of a call that never started was cancelled"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
