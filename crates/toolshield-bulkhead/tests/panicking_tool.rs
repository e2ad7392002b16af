//! A tool that panics frees its slot: the panic unwinds through the bulkhead's future
//! (running, or just admitted from the queue), and the next call gets the slot.

mod support;

use support::{req, settle};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use toolshield_bulkhead::BulkheadLayer;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, Layer, Service, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_tool_that_panics_while_running_frees_its_slot() {
    let layer = BulkheadLayer::new(1).with_queue(1, Duration::from_secs(5));
    let stats = layer.stats();
    let panic_once = Arc::new(AtomicBool::new(true));
    let svc = layer.layer(service_fn(move |_req: ToolRequest| {
        let panics = panic_once.swap(false, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert!(!panics, "tool panicked");
            Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
        }
    }));
    let first = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    // Waits in the queue for the slot the panicking call holds.
    let second = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    assert_eq!(stats.snapshot().queued, 1);
    assert!(first.await.unwrap_err().is_panic());
    assert!(second.await.unwrap().is_ok());
    let snap = stats.snapshot();
    assert_eq!((snap.in_flight, snap.queued), (0, 0));
    assert!(svc.oneshot(req()).await.is_ok());
}

/// A tool whose `call` panics on its first use.
#[derive(Clone)]
struct PanicsInCall(Arc<AtomicBool>);

impl Service<ToolRequest> for PanicsInCall {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = std::future::Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        assert!(!self.0.swap(false, Ordering::SeqCst), "tool panicked");
        std::future::ready(Ok(ToolResponse::new(json!("ok"))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_panics_when_a_queued_call_is_admitted_frees_the_slot() {
    let layer = BulkheadLayer::new(1).with_queue(1, Duration::from_secs(5));
    let stats = layer.stats();
    let armed = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    // The first call holds the slot until the gate opens.
    let holder = {
        let gate = Arc::clone(&gate);
        layer.layer(service_fn(move |_req: ToolRequest| {
            let gate = Arc::clone(&gate);
            async move {
                let _ = gate.acquire().await;
                Ok::<_, ToolError>(ToolResponse::new(json!("held")))
            }
        }))
    };
    let first = tokio::spawn(holder.oneshot(req()));
    settle().await;
    let svc = layer.layer(PanicsInCall(Arc::clone(&armed)));
    armed.store(true, Ordering::SeqCst);
    let queued = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    assert_eq!(stats.snapshot().queued, 1);
    gate.add_permits(1);
    assert!(first.await.unwrap().is_ok());
    assert!(queued.await.unwrap_err().is_panic());
    let snap = stats.snapshot();
    assert_eq!((snap.in_flight, snap.queued), (0, 0));
    assert!(svc.oneshot(req()).await.is_ok());
}
