//! Bulkhead behaviour with a paused clock: limits, queue order and timeout, rejection,
//! release on completion, failure and drop, per-key compartments and their bound.

mod support;

use support::{gated, req, settle};

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use toolshield_bulkhead::{key_fn, BulkheadConfig, BulkheadKey, BulkheadLayer, ByCaller};
use toolshield_contract::CallState;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, Layer, Service, ServiceExt};

/// A tool that records how many calls run at once (and the most ever), and takes `work`.
fn tool(
    now: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    work: Duration,
) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future = impl Send>
       + Clone
       + Send
       + 'static {
    service_fn(move |req: ToolRequest| {
        let now = Arc::clone(&now);
        let peak = Arc::clone(&peak);
        async move {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(n, Ordering::SeqCst);
            // Decrements even when this future is dropped.
            struct Leave(Arc<AtomicUsize>);
            impl Drop for Leave {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let _leave = Leave(now);
            if req.payload().get("fail").is_some() {
                return Err(ToolError::execution_failed("boom"));
            }
            tokio::time::sleep(work).await;
            Ok(ToolResponse::new(json!(req.payload().get("n").cloned())))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_calls_never_exceed_ten_in_flight() {
    let now = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let layer = BulkheadLayer::new(10).with_queue(100, Duration::from_secs(60));
    let stats = layer.stats();
    let svc = layer.layer(tool(
        Arc::clone(&now),
        Arc::clone(&peak),
        Duration::from_millis(10),
    ));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            svc.oneshot(ToolRequest::new("search", json!({"n": i})))
                .await
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().is_ok());
    }
    assert_eq!(peak.load(Ordering::SeqCst), 10);
    let s = stats.snapshot();
    assert_eq!(
        (s.admitted, s.rejected, s.in_flight, s.queued),
        (100, 0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_queue_a_call_beyond_the_limit_is_rejected_at_once_as_overloaded() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(2);
    let stats = layer.stats();
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let a = tokio::spawn(svc.clone().oneshot(req()));
    let b = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    let start = Instant::now();
    let err = svc.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert!(err.is_retriable());
    assert!(!err.counts_for_breaker());
    assert!(
        err.message().contains("bulkhead full for `search`"),
        "{}",
        err.message()
    );
    assert_eq!(stats.snapshot().in_flight, 2);
    gate.add_permits(2);
    assert!(a.await.unwrap().is_ok() && b.await.unwrap().is_ok());
    assert_eq!(stats.snapshot().in_flight, 0);
    // The slots are free again.
    gate.add_permits(1);
    assert!(svc.oneshot(req()).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_queued_call_times_out_after_the_queue_timeout() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).with_queue(5, Duration::from_millis(300));
    let stats = layer.stats();
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let _busy = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    let start = Instant::now();
    let err = svc.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    let s = stats.snapshot();
    assert_eq!((s.rejected, s.queued, s.in_flight), (1, 0, 1));
}

#[tokio::test(start_paused = true)]
async fn the_queue_wait_never_goes_past_the_call_deadline() {
    let gate = Arc::new(Semaphore::new(0));
    let svc = BulkheadLayer::new(1)
        .with_queue(5, Duration::from_secs(10))
        .layer(gated(Arc::clone(&gate)));
    let _busy = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    let start = Instant::now();
    let mut late = req();
    if let Some(state) = toolshield_contract::ShieldRequest::call_state_mut(&mut late) {
        state.set_deadline(start + Duration::from_millis(200));
    }
    let err = svc.clone().oneshot(late).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    // A deadline already passed: rejected without waiting.
    let mut past = req();
    if let Some(state) = toolshield_contract::ShieldRequest::call_state_mut(&mut past) {
        *state = CallState::new().with_deadline(Instant::now());
    }
    let t = Instant::now();
    assert_eq!(
        svc.oneshot(past).await.unwrap_err().kind(),
        ErrorKind::Overloaded
    );
    assert_eq!(t.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn the_queue_is_bounded_and_served_in_fifo_order() {
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = Arc::clone(&order);
    let inner = service_fn(move |req: ToolRequest| {
        let o = Arc::clone(&o);
        async move {
            o.lock().unwrap().push(req.payload()["n"].as_u64().unwrap());
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!(null)))
        }
    });
    let svc = BulkheadLayer::new(1)
        .with_queue(3, Duration::from_secs(10))
        .layer(inner);
    let mut tasks = Vec::new();
    for n in 0..5u64 {
        tasks.push(tokio::spawn(
            svc.clone()
                .oneshot(ToolRequest::new("search", json!({"n": n}))),
        ));
        settle().await;
    }
    let results: Vec<_> = futures_join(tasks).await;
    // One running, three queued, the fifth rejected.
    assert!(results[..4].iter().all(Result::is_ok));
    assert_eq!(
        results[4].as_ref().unwrap_err().kind(),
        ErrorKind::Overloaded
    );
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
}

async fn futures_join(
    tasks: Vec<tokio::task::JoinHandle<Result<ToolResponse, ToolError>>>,
) -> Vec<Result<ToolResponse, ToolError>> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_dropped_queued_call_leaves_the_queue_and_a_dropped_running_call_frees_its_slot() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).with_queue(1, Duration::from_secs(60));
    let stats = layer.stats();
    let mut svc = layer.layer(gated(Arc::clone(&gate)));
    let running = svc.ready().await.unwrap().call(req());
    let running = tokio::spawn(running);
    settle().await;
    let queued = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    assert_eq!(stats.snapshot().queued, 1);
    // The queue (of one) is full.
    assert_eq!(
        svc.clone().oneshot(req()).await.unwrap_err().kind(),
        ErrorKind::Overloaded
    );
    // Cancel the queued call: its place is free again.
    queued.abort();
    settle().await;
    assert_eq!(stats.snapshot().queued, 0);
    let requeued = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    assert_eq!(stats.snapshot().queued, 1);
    // Cancel the running call: the queued one gets its slot.
    running.abort();
    settle().await;
    let s = stats.snapshot();
    assert_eq!((s.queued, s.in_flight), (0, 1));
    gate.add_permits(1);
    assert!(requeued.await.unwrap().is_ok());
    assert_eq!(stats.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_frees_its_slot() {
    let now = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let layer = BulkheadLayer::new(1);
    let stats = layer.stats();
    let svc = layer.layer(tool(now, peak, Duration::ZERO));
    for _ in 0..3 {
        let err = svc
            .clone()
            .oneshot(ToolRequest::new("search", json!({"fail": true})))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ExecutionFailed);
    }
    assert!(svc.oneshot(req()).await.is_ok());
    assert_eq!(stats.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_busy_caller_does_not_take_the_slots_of_another() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).keyed(ByCaller, 100);
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let _alice = tokio::spawn(svc.clone().oneshot(req().caller("alice")));
    settle().await;
    assert_eq!(
        svc.clone()
            .oneshot(req().caller("alice"))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Overloaded
    );
    // Bob and an anonymous call have compartments of their own.
    let bob = tokio::spawn(svc.clone().oneshot(req().caller("bob")));
    let anon = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    gate.add_permits(3);
    assert!(bob.await.unwrap().is_ok());
    assert!(anon.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_hostile_keys_stay_within_the_key_bound() {
    let layer = BulkheadLayer::new(1).keyed(
        key_fn(|r: &ToolRequest| r.payload()["k"].as_str().map(|s| Cow::Owned(s.to_owned()))),
        64,
    );
    let stats = layer.stats();
    let gate = Arc::new(Semaphore::new(0));
    let mut svc = layer.layer(gated(Arc::clone(&gate)));
    // Idle keys are evicted to make room: the map never holds more than the bound.
    gate.add_permits(10_000);
    for i in 0..10_000 {
        let r = ToolRequest::new("search", json!({"k": format!("attacker-{i}")}));
        assert!(svc.ready().await.unwrap().call(r).await.is_ok());
        assert!(stats.snapshot().keys <= 64);
    }
    // Busy keys are never evicted: with every held key busy, a new key is rejected.
    let mut busy = Vec::new();
    for i in 0..64 {
        let r = ToolRequest::new("search", json!({"k": format!("busy-{i}")}));
        busy.push(tokio::spawn(svc.clone().oneshot(r)));
    }
    settle().await;
    assert_eq!(stats.snapshot().in_flight, 64);
    let err = svc
        .clone()
        .oneshot(ToolRequest::new("search", json!({"k": "one-more"})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert!(err.message().contains("too many keys"));
    // A busy key still sees its own limit (its compartment was not replaced).
    let again = svc
        .clone()
        .oneshot(ToolRequest::new("search", json!({"k": "busy-0"})))
        .await
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::Overloaded);
    gate.add_permits(64);
    for b in busy {
        assert!(b.await.unwrap().is_ok());
    }
    assert_eq!(stats.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn poll_ready_never_waits_for_a_slot() {
    let gate = Arc::new(Semaphore::new(0));
    let mut svc = BulkheadLayer::new(1).layer(gated(Arc::clone(&gate)));
    let _busy = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    // Full, yet ready at once: the rejection comes from the call.
    let ready = tokio::time::timeout(Duration::from_millis(1), svc.ready()).await;
    assert!(ready.is_ok());
}

#[test]
fn config_lists_every_problem() {
    let cfg = BulkheadConfig {
        max_concurrent: 0,
        max_queue: 5,
        queue_timeout: Duration::ZERO,
        key: BulkheadKey::Caller,
        max_keys: 0,
    };
    let err = cfg.validate().unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["max_concurrent", "queue_timeout", "max_keys"]);
    assert!(BulkheadLayer::from_config(&cfg).is_err());
    let err = serde_json::from_str::<BulkheadConfig>(r#"{"max_concurent": 3}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field"));
    assert!(BulkheadConfig::default().validate().is_ok());
}

#[tokio::test(start_paused = true)]
async fn from_config_keys_on_the_caller() {
    let cfg: BulkheadConfig =
        serde_json::from_str(r#"{"max_concurrent": 1, "key": "caller"}"#).unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let svc = BulkheadLayer::from_config(&cfg)
        .unwrap()
        .layer(gated(Arc::clone(&gate)));
    let _a = tokio::spawn(svc.clone().oneshot(req().caller("a")));
    let b = tokio::spawn(svc.clone().oneshot(req().caller("b")));
    settle().await;
    assert_eq!(
        svc.clone()
            .oneshot(req().caller("a"))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Overloaded
    );
    gate.add_permits(2);
    assert!(b.await.unwrap().is_ok());
}
