//! Pessimistic timeouts (docs/semantics.md, "Timeouts"): the caller is answered with
//! `TIMEOUT` at the limit even when the tool ignores its attempt token and its future
//! never completes nor wakes anyone (`std::future::pending`), and that future is dropped
//! there. This is what Polly calls a pessimistic timeout; Polly v8's timeout is optimistic
//! only (it cancels the token and waits for the callback to honour it). On tokio's paused
//! clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::{service_fn, Layer, ServiceExt};

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A tool whose future never completes and never registers a timer or a waker, and
/// which never looks at its cancellation token.
fn deaf(
    dropped: Arc<AtomicBool>,
) -> impl tower::Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone {
    service_fn(move |_req: ToolRequest| {
        let flag = DropFlag(dropped.clone());
        async move {
            let _flag = flag;
            std::future::pending::<()>().await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }
    })
}

/// Calls `svc` with `req` and checks the caller got `TIMEOUT` exactly `limit` after the
/// call began, with the tool's future dropped by then.
async fn answered_at<S>(svc: S, req: ToolRequest, limit: Duration, dropped: &AtomicBool)
where
    S: tower::Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    let start = Instant::now();
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), limit);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the tool's future is dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn the_attempt_timeout_answers_at_its_limit_and_drops_the_deaf_future() {
    let dropped = Arc::new(AtomicBool::new(false));
    let svc = TimeoutLayer::new(Duration::from_secs(2)).layer(deaf(dropped.clone()));
    let req = ToolRequest::new("t", json!(null));
    answered_at(svc, req, Duration::from_secs(2), &dropped).await;
}

#[tokio::test(start_paused = true)]
async fn the_total_deadline_answers_at_its_limit_and_drops_the_deaf_future() {
    let dropped = Arc::new(AtomicBool::new(false));
    let svc = DeadlineLayer::new(Duration::from_secs(3)).layer(deaf(dropped.clone()));
    let req = ToolRequest::new("t", json!(null));
    answered_at(svc, req, Duration::from_secs(3), &dropped).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_answers_a_deaf_tool_before_the_attempt_timeout() {
    let dropped = Arc::new(AtomicBool::new(false));
    let svc = TimeoutLayer::new(Duration::from_secs(30)).layer(deaf(dropped.clone()));
    let req =
        ToolRequest::new("t", json!(null)).deadline(Instant::now() + Duration::from_millis(750));
    answered_at(svc, req, Duration::from_millis(750), &dropped).await;
}
