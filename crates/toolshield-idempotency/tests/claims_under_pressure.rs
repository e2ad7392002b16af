//! A running claim is never evicted from a full in-memory store: a flood of other keys
//! must not free the key of a mutation still in flight, or a duplicate runs it again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{advance, sleep};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{
    IdempotencyConfig, IdempotencyLayer, InMemoryIdempotencyStore, MemoryBounds,
};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// A tool that takes 10 s; `runs` counts its executions per key.
fn slow_tool(runs: Arc<[AtomicUsize; 2]>) -> Svc {
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let runs = Arc::clone(&runs);
        async move {
            let i = usize::from(req.payload()["key"] == json!("k2"));
            runs[i].fetch_add(1, Ordering::SeqCst);
            sleep(Duration::from_secs(10)).await;
            Ok(ToolResponse::new(json!({"done": true})))
        }
    }))
}

fn pay(key: &str) -> ToolRequest {
    ToolRequest::new("pay", json!({"key": key}))
        .kind(CallKind::Mutating)
        .idempotency_key(key)
}

#[tokio::test(start_paused = true)]
async fn a_running_claim_is_not_evicted_by_other_keys() {
    let store =
        InMemoryIdempotencyStore::with_config(&MemoryBounds::new(1, 1 << 20)).expect("bounds");
    let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), Arc::new(store))
        .expect("config");
    let runs = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let svc = layer.layer(slow_tool(Arc::clone(&runs)));

    let first = tokio::spawn(svc.clone().oneshot(pay("k1")));
    advance(Duration::from_millis(10)).await;
    // Another key while the store is full of a running claim: it must not take its place.
    let other = tokio::spawn(svc.clone().oneshot(pay("k2")));
    advance(Duration::from_millis(10)).await;
    // A duplicate of the first call, while it still runs.
    let dup = tokio::spawn(svc.clone().oneshot(pay("k1")));
    advance(Duration::from_secs(11)).await;
    let first = first.await.expect("task").expect("first call");
    let dup = dup.await.expect("task").expect("duplicate");
    assert_eq!(runs[0].load(Ordering::SeqCst), 1, "the mutation ran once");
    assert!(dup.provenance.replayed, "the duplicate is a replay");
    assert_eq!(dup.output, first.output);
    let other = other.await.expect("task");
    assert_eq!(
        other.as_ref().map_err(ToolError::kind).err(),
        Some(ErrorKind::StoreUnavailable),
        "a full store refuses a new claim rather than evict a running one: {other:?}"
    );
    assert_eq!(
        runs[1].load(Ordering::SeqCst),
        0,
        "the refused call did not run"
    );
}
