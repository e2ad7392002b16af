//! A keyed bulkhead whose `max_keys` compartments are all busy rejects a new key with
//! `OVERLOADED` ("too many keys in use"). The moment any compartment's last user leaves
//! (its call ends, a queued call is dropped, a call rejected on a busy key returns), the
//! next new key takes its place, however many new keys were rejected in between: a full
//! map never keeps an idle compartment from a caller. Keys are never split: one key's
//! calls never exceed its limit, whatever the interleaving. Paused clock, and a
//! multi-threaded runtime for the interleavings.

mod support;

use support::{gated, settle};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;
use toolshield_bulkhead::{BulkheadLayer, ByCaller};
use toolshield_contract::config::MAX_KEYS;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

fn req(caller: &str) -> ToolRequest {
    ToolRequest::new("search", json!({})).caller(caller)
}

fn too_many_keys(r: Result<ToolResponse, ToolError>) -> bool {
    r.is_err_and(|e| e.kind() == ErrorKind::Overloaded && e.message().contains("too many keys"))
}

#[tokio::test(start_paused = true)]
async fn a_compartment_freed_after_many_rejected_new_keys_goes_to_the_next_one() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).keyed(ByCaller, 2);
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let a = tokio::spawn(svc.clone().oneshot(req("a")));
    let b = tokio::spawn(svc.clone().oneshot(req("b")));
    settle().await;
    for n in 0..100 {
        let r = svc.clone().oneshot(req(&format!("new{n}"))).await;
        assert!(too_many_keys(r), "new key {n} admitted past two busy keys");
    }
    // A call on a busy key is rejected for its key, and leaves the key's compartment as
    // busy as it found it.
    let r = svc.clone().oneshot(req("a")).await.unwrap_err();
    assert_eq!(r.kind(), ErrorKind::Overloaded);
    assert!(!r.message().contains("too many keys"), "{}", r.message());
    gate.add_permits(1);
    settle().await;
    let finished = usize::from(a.is_finished()) + usize::from(b.is_finished());
    assert_eq!(finished, 1, "one of the two held calls ends");
    let c = tokio::spawn(svc.clone().oneshot(req("c")));
    settle().await;
    gate.add_permits(2);
    let r = c.await.unwrap();
    assert!(
        r.is_ok(),
        "the freed compartment goes to the next new key: {r:?}"
    );
    assert!(a.await.unwrap().is_ok() && b.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_queued_call_dropped_as_its_compartments_last_user_frees_it() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1)
        .with_queue(1, Duration::from_secs(60))
        .keyed(ByCaller, 1);
    let stats = layer.stats();
    let mut svc = layer.layer(gated(Arc::clone(&gate)));
    let running = tokio::spawn(svc.clone().oneshot(req("a")));
    settle().await;
    // Queued behind it; never polled by its caller.
    let queued = svc.ready().await.unwrap().call(req("a"));
    assert_eq!(stats.snapshot().queued, 1);
    let r = svc.clone().oneshot(req("other")).await;
    assert!(too_many_keys(r));
    // The running call ends; its slot goes to the queued call, whose caller drops it
    // before it runs: the queue place is the compartment's last user.
    gate.add_permits(1);
    assert!(running.await.unwrap().is_ok());
    // Still held by the queued call.
    let r = svc.clone().oneshot(req("other")).await;
    assert!(too_many_keys(r));
    drop(queued);
    assert_eq!(stats.snapshot().queued, 0);
    gate.add_permits(1);
    let r = svc.clone().oneshot(req("other")).await;
    assert!(
        r.is_ok(),
        "the compartment left idle goes to a new key: {r:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queued_call_that_times_out_frees_its_compartment() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1)
        .with_queue(1, Duration::from_secs(1))
        .keyed(ByCaller, 2);
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let running = tokio::spawn(svc.clone().oneshot(req("a")));
    settle().await;
    let waiting = tokio::spawn(svc.clone().oneshot(req("b-held")));
    settle().await;
    let queued = tokio::spawn(svc.clone().oneshot(req("a")));
    settle().await;
    assert!(too_many_keys(svc.clone().oneshot(req("x")).await));
    // "a" ends, and the call queued behind it takes its slot; "b-held" still runs.
    gate.add_permits(1);
    settle().await;
    assert!(running.is_finished() || waiting.is_finished());
    assert!(too_many_keys(svc.clone().oneshot(req("y")).await));
    gate.add_permits(2);
    settle().await;
    assert!(running.await.unwrap().is_ok());
    assert!(waiting.await.unwrap().is_ok());
    assert!(queued.await.unwrap().is_ok());
    gate.add_permits(1);
    assert!(svc.clone().oneshot(req("z")).await.is_ok());
}

#[test]
fn max_keys_is_clamped_to_the_documented_bound() {
    let layer = BulkheadLayer::new(1).keyed(ByCaller, usize::MAX);
    assert_eq!(layer.stats().max_keys(), Some(MAX_KEYS));
    let layer = BulkheadLayer::new(1).keyed(ByCaller, 0);
    assert_eq!(layer.stats().max_keys(), Some(1));
    assert_eq!(BulkheadLayer::new(1).stats().max_keys(), None);
}

struct Running(Arc<Mutex<HashMap<Arc<str>, usize>>>, Arc<str>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(n) = self.0.lock().unwrap().get_mut(&self.1) {
            *n -= 1;
        }
    }
}

/// Many callers on few keys, from two threads, with calls of random length: no key ever
/// runs more calls at once than its limit (a key is never split across two compartments),
/// and once every call has ended, every key is free for new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_callers_never_split_a_key_and_leave_every_compartment_free() {
    const MAX_KEYS_HELD: usize = 4;
    let running: Arc<Mutex<HashMap<Arc<str>, usize>>> = Arc::default();
    let worst = Arc::new(Mutex::new(0usize));
    let tool = {
        let running = Arc::clone(&running);
        let worst = Arc::clone(&worst);
        BoxCloneService::new(service_fn(move |req: ToolRequest| {
            let running = Arc::clone(&running);
            let worst = Arc::clone(&worst);
            async move {
                let caller = req.meta().caller_id.clone().unwrap_or_default();
                {
                    let mut r = running.lock().unwrap();
                    let n = r.entry(caller.clone()).or_default();
                    *n += 1;
                    let mut w = worst.lock().unwrap();
                    *w = (*w).max(*n);
                }
                // Counts the call out when it ends or is dropped.
                let _running = Running(running, caller.clone());
                for _ in 0..(caller.len() % 3) {
                    tokio::task::yield_now().await;
                }
                Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
            }
        }))
    };
    let layer = BulkheadLayer::new(1)
        .with_queue(2, Duration::from_secs(5))
        .keyed(ByCaller, MAX_KEYS_HELD);
    let stats = layer.stats();
    let svc = layer.layer(tool);
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for _ in 0..2_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = format!("k{}{}", x % 7, "-".repeat((x >> 8) as usize % 3));
                let fut = svc.clone().oneshot(req(&key));
                if x % 5 == 0 {
                    // Dropped at its first poll or before.
                    let _ = tokio::time::timeout(Duration::ZERO, fut).await;
                } else {
                    let _ = fut.await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*worst.lock().unwrap(), 1, "a key ran two calls at once");
    let s = stats.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0));
    for n in 0..MAX_KEYS_HELD {
        let r = svc.clone().oneshot(req(&format!("fresh{n}"))).await;
        assert!(
            r.is_ok(),
            "fresh key {n} refused with every call ended: {r:?}"
        );
    }
}
