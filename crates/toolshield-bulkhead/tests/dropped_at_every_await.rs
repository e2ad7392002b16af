//! A bulkhead call dropped at every `.await` it passes through (driven for exactly N polls,
//! then dropped, for every N up to the polls it needs), on the paused clock: a dropped
//! holder frees its slot at once (the next in line starts then), a dropped waiter frees
//! its queue place at once (a newcomer may take it), and the others keep their order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};
use toolshield_bulkhead::{BulkheadLayer, BulkheadStats};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{drive, polls_to_finish};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;
type Reply = Result<ToolResponse, ToolError>;

const SECOND: Duration = Duration::from_secs(1);

struct Setup {
    svc: Svc,
    stats: BulkheadStats,
    t0: Instant,
    /// When each call (by its payload's `n`) reached the tool, in order.
    starts: Arc<Mutex<Vec<(u64, Duration)>>>,
}

impl Setup {
    /// One slot, a queue of three waiting up to a minute, a tool taking 1 s.
    fn new() -> Self {
        let layer = BulkheadLayer::new(1).with_queue(3, 60 * SECOND);
        let starts: Arc<Mutex<Vec<(u64, Duration)>>> = Arc::default();
        let seen = Arc::clone(&starts);
        let t0 = Instant::now();
        let svc = BoxCloneService::new(layer.layer(service_fn(move |req: ToolRequest| {
            let n = req.payload()["n"].as_u64().unwrap_or(0);
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().expect("starts").push((n, Instant::now() - t0));
                sleep(SECOND).await;
                Ok::<_, ToolError>(ToolResponse::new(json!(n)))
            }
        })));
        Setup {
            svc,
            stats: layer.stats(),
            t0,
            starts,
        }
    }

    fn req(n: u64) -> ToolRequest {
        ToolRequest::new("search", json!({ "n": n }))
    }

    async fn call(&self, n: u64) -> impl std::future::Future<Output = Reply> {
        let mut svc = self.svc.clone();
        svc.ready().await.expect("ready");
        svc.call(Self::req(n))
    }

    /// A call made now (its place taken in `call`), driven by a task.
    async fn spawn(&self, n: u64) -> JoinHandle<Reply> {
        tokio::spawn(self.call(n).await)
    }

    fn started(&self, n: u64) -> Option<Duration> {
        self.starts
            .lock()
            .expect("starts")
            .iter()
            .find(|(m, _)| *m == n)
            .map(|(_, at)| *at)
    }

    fn order(&self) -> Vec<u64> {
        self.starts
            .lock()
            .expect("starts")
            .iter()
            .map(|(n, _)| *n)
            .collect()
    }

    fn now(&self) -> Duration {
        Instant::now() - self.t0
    }
}

#[tokio::test(start_paused = true)]
async fn a_holder_dropped_at_any_await_frees_its_slot_at_once() {
    let (needed, out) = polls_to_finish(Setup::new().call(1).await).await;
    assert!(out.is_ok() && needed >= 2, "{needed} polls");
    for n in 0..=needed {
        let s = Setup::new();
        let holder = s.call(1).await;
        let waiters = [s.spawn(2).await, s.spawn(3).await];
        let driven = drive(holder, n).await;
        let dropped_at = s.now();
        let snap = s.stats.snapshot();
        if !driven.finished() {
            // The slot went to the next in line at once: nobody holds it for the dropped.
            assert!(snap.in_flight <= 1, "{n} polls: {snap:?}");
        }
        for w in waiters {
            assert!(w.await.expect("waiter").is_ok(), "{n} polls");
        }
        let next = s.started(2).expect("the next in line ran");
        if driven.finished() {
            assert_eq!(next, SECOND, "{n} polls");
        } else {
            assert_eq!(
                next, dropped_at,
                "{n} polls: the slot was not freed at once"
            );
        }
        assert_eq!(
            s.order().last(),
            Some(&3),
            "{n} polls: the queue kept its order"
        );
        let snap = s.stats.snapshot();
        assert_eq!((snap.in_flight, snap.queued), (0, 0), "{n} polls");
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_at_any_await_frees_its_place_at_once_and_keeps_the_order() {
    // The polls of a waiter behind a holder, to its end.
    let s = Setup::new();
    let holder = s.spawn(1).await;
    let (needed, out) = polls_to_finish(s.call(2).await).await;
    assert!(out.is_ok() && holder.await.expect("holder").is_ok());
    assert!(needed >= 2, "{needed} polls");
    for n in 0..=needed {
        let s = Setup::new();
        let holder = s.spawn(1).await;
        let dropped = s.call(2).await;
        let behind = [s.spawn(3).await, s.spawn(4).await];
        // The queue (three places) is full: a newcomer is refused.
        let refused = s.svc.clone().oneshot(Setup::req(9)).await;
        assert!(
            matches!(&refused, Err(e) if e.kind() == ErrorKind::Overloaded),
            "{n} polls: {refused:?}"
        );
        let driven = drive(dropped, n).await;
        let ran = s.started(2).is_some();
        let snap = s.stats.snapshot();
        if !driven.finished() && !ran {
            // Its place is free at once: one holder and the two behind, nothing else.
            assert_eq!(snap.queued + snap.in_flight, 3, "{n} polls: {snap:?}");
            let late = s.spawn(5).await;
            assert_eq!(
                s.stats.snapshot().queued + s.stats.snapshot().in_flight,
                4,
                "{n} polls: the freed place was not taken"
            );
            assert!(late.await.expect("late").is_ok(), "{n} polls");
        }
        assert!(holder.await.expect("holder").is_ok());
        for b in behind {
            assert!(b.await.expect("behind").is_ok(), "{n} polls");
        }
        let order: Vec<u64> = s
            .order()
            .into_iter()
            .filter(|m| *m != 2 && *m != 5)
            .collect();
        assert_eq!(
            order,
            vec![1, 3, 4],
            "{n} polls: the others lost their order"
        );
        if !ran {
            // The next in line started when the holder ended, not a call later.
            assert_eq!(s.started(3), Some(SECOND), "{n} polls");
        }
        let snap = s.stats.snapshot();
        assert_eq!((snap.in_flight, snap.queued), (0, 0), "{n} polls");
    }
}

#[tokio::test(start_paused = true)]
async fn two_clones_of_one_request_sent_at_once_take_two_slots() {
    let layer = BulkheadLayer::new(2);
    let stats = layer.stats();
    let svc = layer.layer(service_fn(|_r: ToolRequest| async {
        sleep(SECOND).await;
        Ok::<_, ToolError>(ToolResponse::new(json!(true)))
    }));
    let r = Setup::req(1);
    let a = tokio::spawn(svc.clone().oneshot(r.clone()));
    let b = tokio::spawn(svc.clone().oneshot(r.clone()));
    sleep(Duration::from_millis(10)).await;
    assert_eq!(stats.snapshot().in_flight, 2);
    // A third copy finds no slot (and no queue).
    let c = svc.clone().oneshot(r).await;
    assert!(
        matches!(&c, Err(e) if e.kind() == ErrorKind::Overloaded),
        "{c:?}"
    );
    assert!(a.await.expect("a").is_ok() && b.await.expect("b").is_ok());
    assert_eq!(stats.snapshot().in_flight, 0);
}
