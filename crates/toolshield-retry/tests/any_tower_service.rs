//! The retry layer around services that know nothing of toolshield: plain request
//! types, tower's `BoxError`, tower's own `Timeout`, and readiness errors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use toolshield_core::{BoxError, ErrorKind, ToolError};
use toolshield_retry::{BackoffStrategy, RetryLayer};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

fn no_wait(max_attempts: u32) -> RetryLayer {
    RetryLayer::new(max_attempts)
        .with_backoff(BackoffStrategy::none())
        .without_budget()
}

#[tokio::test(start_paused = true)]
async fn a_plain_string_service_with_box_errors_is_retried_by_kind() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = service_fn(move |req: String| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < 2 {
                Err::<String, BoxError>(Box::new(std::io::Error::from(
                    std::io::ErrorKind::ConnectionRefused,
                )))
            } else {
                Ok(format!("{req}!"))
            }
        }
    });
    let res = no_wait(3)
        .layer(svc)
        .oneshot(String::from("hi"))
        .await
        .unwrap();
    assert_eq!(res, "hi!");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn towers_own_timeout_elapsed_is_a_retried_timeout() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let slow_then_fast = service_fn(move |_req: String| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Ok::<_, BoxError>(String::from("done"))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(no_wait(3))
        .timeout(Duration::from_secs(1))
        .service(slow_then_fast);
    let res = svc.oneshot(String::from("q")).await.unwrap();
    assert_eq!(res, "done");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Always slow: the last error is TIMEOUT.
    let always_slow = service_fn(|_req: String| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<_, BoxError>(String::from("late"))
    });
    let svc = ServiceBuilder::new()
        .layer(no_wait(2))
        .timeout(Duration::from_secs(1))
        .service(always_slow);
    let e = svc.oneshot(String::from("q")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(e.attempts(), 2);
}

/// A service whose readiness fails.
#[derive(Clone)]
struct NeverReady;

impl Service<String> for NeverReady {
    type Response = String;
    type Error = BoxError;
    type Future = std::future::Ready<Result<String, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Err(Box::new(ToolError::new(
            ErrorKind::UpstreamUnavailable,
            "pool closed",
        ))))
    }

    fn call(&mut self, req: String) -> Self::Future {
        std::future::ready(Ok(req))
    }
}

#[tokio::test(start_paused = true)]
async fn a_readiness_error_of_the_inner_service_is_returned_by_poll_ready() {
    let mut svc = no_wait(3).layer(NeverReady);
    let e = std::future::poll_fn(|cx| svc.poll_ready(cx))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::UpstreamUnavailable,
        "the kind survives the box"
    );
}
