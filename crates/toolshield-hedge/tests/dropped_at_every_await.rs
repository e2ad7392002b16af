//! A hedged call dropped at every `.await` it passes through (driven for exactly N polls,
//! then dropped, for every N up to the polls it needs), on the paused clock: every
//! attempt in flight is cancelled (its token fires, its future is dropped) and gives its
//! bulkhead slot back at once, and a hedge launched just before the drop does not run on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use toolshield_bulkhead::{BulkheadLayer, BulkheadStats};
use toolshield_contract::{CallKind, ShieldRequest};
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_test::{drive, polls_to_finish, Driven};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

struct Setup {
    svc: Svc,
    slots: BulkheadStats,
    /// The attempt token of every attempt sent, in order.
    tokens: Arc<Mutex<Vec<CancellationToken>>>,
    /// Attempts whose work ran to its end (the work runs on a task of its own, as a
    /// tool's I/O would, and stops when its attempt token fires).
    completed: Arc<AtomicUsize>,
}

impl Setup {
    /// Hedges after 100 ms, two at most, around a bulkhead of three slots around a tool
    /// whose attempt `k` (from 0) takes `1000 - 400 k` ms: the last hedge wins.
    fn new() -> Self {
        let tokens: Arc<Mutex<Vec<CancellationToken>>> = Arc::default();
        let completed = Arc::new(AtomicUsize::new(0));
        let (seen, done) = (Arc::clone(&tokens), Arc::clone(&completed));
        let tool = service_fn(move |req: ToolRequest| {
            let token = req
                .call_state()
                .map(|s| s.tokens().attempt().clone())
                .expect("a tool request has tokens");
            let k = {
                let mut seen = seen.lock().expect("tokens");
                seen.push(token.clone());
                seen.len() as u64 - 1
            };
            let done = Arc::clone(&done);
            let work = tokio::spawn(async move {
                tokio::select! {
                    () = sleep(Duration::from_millis(1_000 - 400 * k.min(2))) => {
                        done.fetch_add(1, Ordering::SeqCst);
                        true
                    }
                    () = token.cancelled() => false,
                }
            });
            async move {
                match work.await {
                    Ok(true) => Ok(ToolResponse::new(json!(k))),
                    _ => Err(ToolError::cancelled("attempt cancelled")),
                }
            }
        });
        let bulkhead = BulkheadLayer::new(3);
        let slots = bulkhead.stats();
        let hedge = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 2);
        Setup {
            svc: BoxCloneService::new(hedge.layer(bulkhead.layer(tool))),
            slots,
            tokens,
            completed,
        }
    }

    async fn call(
        &self,
        req: ToolRequest,
    ) -> impl std::future::Future<Output = Result<ToolResponse, ToolError>> {
        let mut svc = self.svc.clone();
        svc.ready().await.expect("ready");
        svc.call(req)
    }

    fn sent(&self) -> usize {
        self.tokens.lock().expect("tokens").len()
    }

    fn cancelled(&self) -> Vec<bool> {
        self.tokens
            .lock()
            .expect("tokens")
            .iter()
            .map(CancellationToken::is_cancelled)
            .collect()
    }
}

fn read() -> ToolRequest {
    ToolRequest::new("search", json!({})).kind(CallKind::ReadOnly)
}

#[tokio::test(start_paused = true)]
async fn a_hedged_call_dropped_at_any_await_cancels_every_attempt_and_frees_its_slots() {
    let s = Setup::new();
    let (needed, out) = polls_to_finish(s.call(read()).await).await;
    assert_eq!(
        out.expect("answered").output,
        json!(2),
        "the last hedge wins"
    );
    assert_eq!(s.sent(), 3);
    for n in 0..=needed {
        let s = Setup::new();
        let driven = drive(s.call(read()).await, n).await;
        // Every slot is back at once, whatever was in flight.
        assert_eq!(s.slots.snapshot().in_flight, 0, "{n} polls");
        let sent = s.sent();
        let cancelled = s.cancelled();
        match &driven {
            Driven::Finished(out) => {
                assert!(out.is_ok(), "{n} polls");
                assert_eq!(
                    cancelled,
                    vec![true, true, false],
                    "{n} polls: the losers only"
                );
            }
            Driven::Dropped => {
                assert!(
                    cancelled.iter().all(|c| *c),
                    "{n} polls: {sent} attempts sent, cancelled {cancelled:?}"
                );
            }
        }
        // Nothing runs on: no attempt of a dropped call ever completes its work, and no
        // further hedge is sent.
        sleep(Duration::from_secs(5)).await;
        assert_eq!(s.sent(), sent, "{n} polls: a hedge was sent after the drop");
        let completed = s.completed.load(Ordering::SeqCst);
        assert_eq!(
            completed,
            usize::from(driven.finished()),
            "{n} polls: {completed} ran on"
        );
        assert_eq!(s.slots.snapshot().in_flight, 0, "{n} polls");
    }
}

#[tokio::test(start_paused = true)]
async fn two_clones_of_one_request_are_hedged_apart_and_one_dropped_leaves_the_other_whole() {
    // Clones sent as separate calls each get a call token of their own, as
    // docs/semantics.md says (clones share their tokens otherwise).
    let parent = CancellationToken::new();
    // Both answered: two hedged calls, each with its own attempts.
    let s = Setup::new();
    let r = read();
    let (a, b) = tokio::join!(
        s.svc
            .clone()
            .oneshot(r.clone().cancel_token(parent.child_token())),
        s.svc.clone().oneshot(r.cancel_token(parent.child_token()))
    );
    assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
    assert!((2..=6).contains(&s.sent()), "{} attempts", s.sent());
    // One clone's caller gives up at every await: the other clone is still answered.
    let (needed, _) = polls_to_finish(Setup::new().call(read()).await).await;
    for n in 0..=needed {
        let s = Setup::new();
        let r = read();
        let mine = r.clone().cancel_token(parent.child_token());
        let theirs = r.cancel_token(parent.child_token());
        let other = tokio::spawn(s.svc.clone().oneshot(theirs));
        let _ = drive(s.call(mine).await, n).await;
        let got = other.await.expect("other");
        assert!(got.is_ok(), "{n} polls: the other clone got {got:?}");
    }
}
