//! A queued call that leaves the queue (its deadline passes, its token is cancelled, its
//! future is dropped at the moment a slot is handed to it, or its queue timeout ends as
//! the slot frees) takes nothing with it: its queue place is free at once, the slot goes
//! to the next call in line, and the counters come back to zero. Paused clock.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_bulkhead::{BulkheadLayer, BulkheadStats};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// A tool that records the `n` of each call it starts, counts the calls running at once
/// (and the most ever), and waits until the test releases it (one permit per call).
#[derive(Clone)]
struct Probe {
    started: Arc<Mutex<Vec<u64>>>,
    now: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Probe {
    fn new() -> Self {
        Probe {
            started: Arc::default(),
            now: Arc::default(),
            peak: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    fn tool(&self) -> Svc {
        let p = self.clone();
        BoxCloneService::new(service_fn(move |req: ToolRequest| {
            let p = p.clone();
            async move {
                p.started
                    .lock()
                    .unwrap()
                    .push(req.payload()["n"].as_u64().unwrap_or(u64::MAX));
                let n = p.now.fetch_add(1, Ordering::SeqCst) + 1;
                p.peak.fetch_max(n, Ordering::SeqCst);
                struct Leave(Arc<AtomicUsize>);
                impl Drop for Leave {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let _leave = Leave(Arc::clone(&p.now));
                if let Ok(permit) = p.gate.acquire().await {
                    permit.forget();
                }
                Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
            }
        }))
    }

    fn started(&self) -> Vec<u64> {
        self.started.lock().unwrap().clone()
    }

    fn release(&self, calls: usize) {
        self.gate.add_permits(calls);
    }
}

fn req(n: u64) -> ToolRequest {
    ToolRequest::new("search", json!({ "n": n }))
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// The call `n`, made now (it takes its slot or its place in line in `call`), its future
/// not yet polled.
async fn call_now(svc: &mut Svc, n: u64) -> impl Future<Output = Result<ToolResponse, ToolError>> {
    svc.ready().await.unwrap().call(req(n))
}

fn assert_empty(stats: &BulkheadStats) {
    let s = stats.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0), "nothing held: {s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_deadline_passes_leaves_the_queue_and_the_next_is_admitted_in_its_place() {
    let probe = Probe::new();
    let layer = BulkheadLayer::new(1).with_queue(2, Duration::from_secs(60));
    let stats = layer.stats();
    let svc = Svc::new(layer.layer(probe.tool()));
    let holder = tokio::spawn(svc.clone().oneshot(req(0)));
    settle().await;

    let start = Instant::now();
    let early = tokio::spawn(
        svc.clone()
            .oneshot(req(1).deadline(start + Duration::from_millis(100))),
    );
    let patient = tokio::spawn(svc.clone().oneshot(req(2)));
    settle().await;
    assert_eq!(stats.snapshot().queued, 2);

    tokio::time::advance(Duration::from_millis(100)).await;
    let err = early.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded, "{err}");
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(
        stats.snapshot().queued,
        1,
        "the waiter whose deadline passed left the queue"
    );

    // Its place is free: one more call may queue, the one after it may not.
    let newcomer = tokio::spawn(svc.clone().oneshot(req(3)));
    settle().await;
    assert_eq!(stats.snapshot().queued, 2);
    let over = svc.clone().oneshot(req(4)).await.unwrap_err();
    assert_eq!(over.kind(), ErrorKind::Overloaded);

    // The slot goes to the call queued first, then the newcomer; never the call that left.
    probe.release(1);
    assert!(holder.await.unwrap().is_ok());
    settle().await;
    assert_eq!(probe.started(), vec![0, 2]);
    probe.release(2);
    assert!(patient.await.unwrap().is_ok());
    assert!(newcomer.await.unwrap().is_ok());
    assert_eq!(probe.started(), vec![0, 2, 3]);
    assert_eq!(probe.peak.load(Ordering::SeqCst), 1);
    assert_empty(&stats);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_at_the_head_of_the_queue_hands_the_next_slot_to_the_call_behind_it() {
    let probe = Probe::new();
    let layer = BulkheadLayer::new(1).with_queue(2, Duration::from_secs(60));
    let stats = layer.stats();
    let svc = Svc::new(layer.layer(probe.tool()));
    let holder = tokio::spawn(svc.clone().oneshot(req(0)));
    settle().await;
    let token = CancellationToken::new();
    let head = tokio::spawn(svc.clone().oneshot(req(1).cancel_token(token.clone())));
    settle().await;
    let behind = tokio::spawn(svc.clone().oneshot(req(2)));
    settle().await;

    token.cancel();
    let err = head.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(stats.snapshot().queued, 1);

    probe.release(2);
    assert!(holder.await.unwrap().is_ok());
    assert!(behind.await.unwrap().is_ok());
    assert_eq!(probe.started(), vec![0, 2], "the cancelled call never ran");
    assert_empty(&stats);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_as_its_slot_is_handed_over_passes_the_slot_to_the_next() {
    let probe = Probe::new();
    let layer = BulkheadLayer::new(1).with_queue(2, Duration::from_secs(60));
    let stats = layer.stats();
    let mut svc = Svc::new(layer.layer(probe.tool()));
    let holder = tokio::spawn(svc.clone().oneshot(req(0)));
    settle().await;
    // Two calls queued in order; the first one's future is never polled.
    let first = call_now(&mut svc, 1).await;
    let second = tokio::spawn(call_now(&mut svc, 2).await);
    settle().await;
    assert_eq!(stats.snapshot().queued, 2);

    // The holder ends: its slot is handed to the first waiter, which is dropped before it
    // ever sees it.
    probe.release(1);
    assert!(holder.await.unwrap().is_ok());
    settle().await;
    drop(first);
    settle().await;
    assert_eq!(
        probe.started(),
        vec![0, 2],
        "the slot of the dropped waiter went to the next in line"
    );
    probe.release(1);
    assert!(second.await.unwrap().is_ok());
    assert_empty(&stats);
    // Nothing was lost: a new call takes the one slot at once.
    let start = Instant::now();
    let now = tokio::spawn(svc.clone().oneshot(req(3)));
    settle().await;
    assert_eq!(probe.started(), vec![0, 2, 3]);
    probe.release(1);
    assert!(now.await.unwrap().is_ok());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(probe.peak.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_queue_timeout_ends_as_the_slot_frees_never_loses_the_slot() {
    // The holder ends at the very instant the first waiter's queue timeout ends: whichever
    // wins, the slot is used by exactly one call and then comes back.
    for holder_work in [
        Duration::from_millis(99),
        Duration::from_millis(100),
        Duration::from_millis(101),
    ] {
        let probe = Probe::new();
        let layer = BulkheadLayer::new(1).with_queue(2, Duration::from_millis(100));
        let stats = layer.stats();
        let mut svc = Svc::new(layer.layer(probe.tool()));
        let holder = tokio::spawn(svc.clone().oneshot(req(0)));
        settle().await;
        let first = tokio::spawn(call_now(&mut svc, 1).await);
        let second = tokio::spawn(call_now(&mut svc, 2).await);
        settle().await;
        tokio::time::advance(holder_work).await;
        probe.release(1);
        assert!(holder.await.unwrap().is_ok());
        settle().await;
        tokio::time::advance(Duration::from_millis(2)).await;
        settle().await;
        // Release every call that got the slot.
        probe.release(2);
        let (a, b) = (first.await.unwrap(), second.await.unwrap());
        let ran = probe.started();
        for (n, out) in [(1, a), (2, b)] {
            match out {
                Ok(_) => assert!(ran.contains(&n), "{holder_work:?}: {n} answered, so it ran"),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Overloaded, "{holder_work:?}: {e}");
                    assert!(
                        !ran.contains(&n),
                        "{holder_work:?}: {n} rejected, never ran"
                    );
                }
            }
        }
        if holder_work < Duration::from_millis(100) {
            assert_eq!(ran, vec![0, 1], "{holder_work:?}: freed before the timeout");
        }
        assert_eq!(probe.peak.load(Ordering::SeqCst), 1, "{holder_work:?}");
        assert_empty(&stats);
        let s = stats.snapshot();
        assert_eq!(
            s.admitted + s.rejected,
            3,
            "{holder_work:?}: every call admitted or rejected once: {s:?}"
        );
        // The slot is back: a new call is admitted at once.
        let next = tokio::spawn(svc.clone().oneshot(req(9)));
        settle().await;
        assert_eq!(probe.started().last(), Some(&9), "{holder_work:?}");
        probe.release(1);
        assert!(next.await.unwrap().is_ok());
    }
}
