//! The queue is served in the order calls were made (`call`), not in the order their
//! futures were first polled: a call queued first is admitted first, and a newcomer never
//! takes a slot that a queued call is waiting for.

mod support;

use support::settle;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;
use toolshield_bulkhead::BulkheadLayer;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::Rng;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

fn req(n: u64) -> ToolRequest {
    ToolRequest::new("search", json!({"n": n}))
}

/// A tool that records the order calls start in, then waits for one permit of `gate`.
fn recording(order: Arc<Mutex<Vec<u64>>>, gate: Arc<Semaphore>) -> Svc {
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let order = Arc::clone(&order);
        let gate = Arc::clone(&gate);
        async move {
            order
                .lock()
                .unwrap()
                .push(req.payload()["n"].as_u64().unwrap());
            if let Ok(p) = gate.acquire().await {
                p.forget();
            }
            Ok::<_, ToolError>(ToolResponse::new(json!(null)))
        }
    }))
}

#[tokio::test(start_paused = true)]
async fn the_queue_is_served_in_call_order_whatever_order_the_futures_are_polled_in() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).with_queue(2, Duration::from_secs(60));
    let mut svc = layer.layer(recording(Arc::clone(&order), Arc::clone(&gate)));

    let running = tokio::spawn(svc.ready().await.unwrap().call(req(0)));
    settle().await;
    let first = svc.ready().await.unwrap().call(req(1));
    let second = svc.ready().await.unwrap().call(req(2));
    // The later call's future is polled first.
    let second = tokio::spawn(second);
    settle().await;
    let first = tokio::spawn(first);
    settle().await;

    gate.add_permits(1);
    settle().await;
    assert_eq!(
        *order.lock().unwrap(),
        vec![0, 1],
        "the call queued first goes first"
    );
    gate.add_permits(2);
    for t in [running, first, second] {
        t.await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_never_takes_the_slot_a_queued_call_waits_for() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).with_queue(2, Duration::from_secs(60));
    let stats = layer.stats();
    let mut svc = layer.layer(recording(Arc::clone(&order), Arc::clone(&gate)));

    let running = tokio::spawn(svc.ready().await.unwrap().call(req(0)));
    settle().await;
    // Queued, its future not polled yet.
    let queued = svc.ready().await.unwrap().call(req(1));
    // The running call ends: its slot belongs to the queued call.
    gate.add_permits(1);
    running.await.unwrap().unwrap();
    let newcomer = tokio::spawn(svc.ready().await.unwrap().call(req(2)));
    settle().await;
    assert_eq!(
        *order.lock().unwrap(),
        vec![0],
        "the newcomer did not jump the queue"
    );
    assert_eq!(stats.snapshot().queued, 2);

    let queued = tokio::spawn(queued);
    settle().await;
    assert_eq!(*order.lock().unwrap(), vec![0, 1]);
    gate.add_permits(2);
    queued.await.unwrap().unwrap();
    newcomer.await.unwrap().unwrap();
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    let s = stats.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0));
}

/// A tool that works `n` ms (its payload), counting the calls running at once.
fn counting(now: Arc<AtomicUsize>, peak: Arc<AtomicUsize>) -> Svc {
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let now = Arc::clone(&now);
        let peak = Arc::clone(&peak);
        async move {
            struct Leave(Arc<AtomicUsize>);
            impl Drop for Leave {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(n, Ordering::SeqCst);
            let _leave = Leave(now);
            let ms = req.payload()["n"].as_u64().unwrap();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!(null)))
        }
    }))
}

/// Random plans of calls, futures held unpolled, polled, dropped before or after their
/// first poll, and time passing, checked against the invariants: never more calls in
/// flight or waiting than allowed, every outcome a success or `OVERLOADED`, and once
/// everything has ended no slot or queue place is left taken.
#[tokio::test(start_paused = true)]
async fn random_calls_and_drops_keep_the_limits_and_leak_no_slot_or_place() {
    for seed in 0..200u64 {
        let mut rng = Rng::new(seed);
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let layer = BulkheadLayer::new(2).with_queue(3, Duration::from_millis(50));
        let stats = layer.stats();
        let mut svc = layer.layer(counting(Arc::clone(&now), Arc::clone(&peak)));
        let mut held = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..60 {
            match rng.below(6) {
                0 | 1 => {
                    let ms = 1 + rng.below(80);
                    held.push(svc.ready().await.unwrap().call(req(ms)));
                }
                2 if !held.is_empty() => {
                    let f = held.swap_remove(rng.below(held.len() as u64) as usize);
                    if rng.below(3) == 0 {
                        drop(f);
                    } else {
                        tasks.push(tokio::spawn(f));
                    }
                }
                3 if !tasks.is_empty() => {
                    let t: tokio::task::JoinHandle<_> =
                        tasks.swap_remove(rng.below(tasks.len() as u64) as usize);
                    t.abort();
                    let _ = t.await;
                }
                4 => tokio::time::advance(Duration::from_millis(1 + rng.below(40))).await,
                _ => settle().await,
            }
            let s = stats.snapshot();
            assert!(s.in_flight <= 2, "seed {seed}: {} in flight", s.in_flight);
            assert!(s.queued <= 3, "seed {seed}: {} queued", s.queued);
            assert!(
                peak.load(Ordering::SeqCst) <= 2,
                "seed {seed}: limit exceeded"
            );
        }
        for f in held.drain(..) {
            tasks.push(tokio::spawn(f));
        }
        settle().await;
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => {}
                Err(e) => assert_eq!(e.kind(), ErrorKind::Overloaded, "seed {seed}"),
            }
        }
        let s = stats.snapshot();
        assert_eq!((s.in_flight, s.queued), (0, 0), "seed {seed}");
        assert_eq!(now.load(Ordering::SeqCst), 0, "seed {seed}");
        // Both slots are free: two calls start at once.
        let a = tokio::spawn(svc.ready().await.unwrap().call(req(10)));
        let b = tokio::spawn(svc.ready().await.unwrap().call(req(10)));
        settle().await;
        assert_eq!(stats.snapshot().in_flight, 2, "seed {seed}: a slot leaked");
        assert_eq!(stats.snapshot().queued, 0, "seed {seed}");
        tokio::time::advance(Duration::from_millis(10)).await;
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
    }
}
