//! A queued call whose caller cancels it (its call token, without dropping the future)
//! leaves the queue at once, as Polly's concurrency limiter and Resilience4j's bulkhead
//! give up a wait on cancellation: it never holds a queue place until the queue timeout,
//! and is never admitted to run a cancelled call. Paused clock.

mod support;

use support::{req, settle};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_bulkhead::BulkheadLayer;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// A tool that counts its calls and waits until the test releases it.
fn gated(gate: Arc<Semaphore>, calls: Arc<AtomicUsize>) -> Svc {
    BoxCloneService::new(service_fn(move |_req: ToolRequest| {
        let gate = Arc::clone(&gate);
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if let Ok(p) = gate.acquire().await {
                p.forget();
            }
            Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
        }
    }))
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_the_queue_at_once_and_never_runs() {
    let gate = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = BulkheadLayer::new(1).with_queue(1, Duration::from_secs(60));
    let stats = layer.stats();
    let svc = layer.layer(gated(Arc::clone(&gate), Arc::clone(&calls)));
    let busy = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;

    let token = CancellationToken::new();
    let start = Instant::now();
    let queued = tokio::spawn(svc.clone().oneshot(req().cancel_token(token.clone())));
    settle().await;
    assert_eq!(stats.snapshot().queued, 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    token.cancel();
    settle().await;
    assert!(queued.is_finished(), "the cancelled waiter is still queued");
    let err = queued.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let s = stats.snapshot();
    assert_eq!((s.queued, s.in_flight, s.rejected), (0, 1, 0));

    // Its place is free for another caller, and the freed slot goes to that one.
    let next = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    assert_eq!(stats.snapshot().queued, 1);
    gate.add_permits(2);
    assert!(busy.await.unwrap().is_ok());
    assert!(next.await.unwrap().is_ok());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the cancelled call never reached the tool"
    );
    let s = stats.snapshot();
    assert_eq!((s.queued, s.in_flight, s.admitted), (0, 0, 2));
}

#[tokio::test(start_paused = true)]
async fn an_already_cancelled_call_does_not_take_a_queue_place() {
    let gate = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = BulkheadLayer::new(1).with_queue(1, Duration::from_secs(60));
    let stats = layer.stats();
    let svc = layer.layer(gated(Arc::clone(&gate), Arc::clone(&calls)));
    let _busy = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    let token = CancellationToken::new();
    token.cancel();
    let start = Instant::now();
    let err = svc
        .clone()
        .oneshot(req().cancel_token(token))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(stats.snapshot().queued, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
