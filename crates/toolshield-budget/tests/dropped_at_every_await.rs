//! A budgeted call dropped at every `.await` it passes through (driven for exactly N polls,
//! then dropped, for every N up to the polls it needs), on the paused clock, with the
//! ledger in memory and behind a store that takes time to answer: a call is charged when
//! it is admitted and never refunded (docs/budget.md), so a call dropped after its charge
//! is charged exactly once whether the tool ran or not, a call dropped before its charge
//! is not charged and never runs, and concurrent drops never take a run past its limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::sleep;
use toolshield_budget::{
    BudgetLayer, BudgetLedger, BudgetStore, Charge, LedgerConfig, MemoryBudgetStore, StoreFuture,
    Verdict,
};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::Rng;
use toolshield_test::{drive, polls_to_finish, Driven};
use tower::util::BoxCloneSyncService;
use tower::{service_fn, Layer, Service, ServiceExt};

type Tool = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

/// The run every call here belongs to, and its key in the store.
const RUN: &str = "r1";
const KEY: &str = "r:r1";

/// A store that answers each charge 50 ms after it is asked, charging the memory store
/// then: a charge dropped while it waits is never applied.
#[derive(Debug)]
struct SlowStore(MemoryBudgetStore);

impl BudgetStore for SlowStore {
    fn charge<'a>(&'a self, charge: Charge<'a>) -> StoreFuture<'a, Verdict> {
        Box::pin(async move {
            sleep(Duration::from_millis(50)).await;
            self.0.charge_now(&charge)
        })
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Slow,
}

struct Setup {
    memory: MemoryBudgetStore,
    svc: Tool,
    started: Arc<AtomicUsize>,
}

impl Setup {
    /// A ledger of `run_max_calls` calls per run, and a tool of `max_calls` calls costing
    /// 2 that takes 1 s.
    fn new(kind: Kind, max_calls: Option<u64>, run_max_calls: u64) -> Self {
        let cfg = LedgerConfig {
            run_max_calls: Some(run_max_calls),
            ..LedgerConfig::default()
        };
        let (ledger, memory) = match kind {
            Kind::Memory => {
                let ledger = BudgetLedger::from_config(&cfg).expect("valid");
                let memory = ledger.memory_store().expect("in memory").clone();
                (ledger, memory)
            }
            Kind::Slow => {
                let memory = MemoryBudgetStore::new(100);
                let store = Arc::new(SlowStore(memory.clone()));
                (
                    BudgetLedger::with_store(&cfg, store).expect("valid"),
                    memory,
                )
            }
        };
        let started = Arc::new(AtomicUsize::new(0));
        let runs = Arc::clone(&started);
        let svc = BudgetLayer::new(&ledger, "search", max_calls)
            .cost(2)
            .layer(service_fn(move |_r: ToolRequest| {
                runs.fetch_add(1, Ordering::SeqCst);
                async {
                    sleep(Duration::from_secs(1)).await;
                    Ok::<_, ToolError>(ToolResponse::new(json!(true)))
                }
            }));
        Setup {
            memory,
            svc: BoxCloneSyncService::new(svc),
            started,
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

    /// The run's `(calls, cost)`.
    fn usage(&self) -> (u64, u64) {
        self.memory.usage(KEY).unwrap_or((0, 0))
    }
}

fn req() -> ToolRequest {
    ToolRequest::new("search", json!({})).run_id(RUN)
}

async fn a_dropped_call_is_charged_once_or_not_at_all(kind: Kind) {
    let s = Setup::new(kind, Some(3), 10);
    let (needed, out) = polls_to_finish(s.call(req()).await).await;
    assert!(out.is_ok());
    assert!(needed >= 2, "{kind:?}: {needed} polls");
    for n in 0..=needed {
        let s = Setup::new(kind, Some(3), 10);
        let driven = drive(s.call(req()).await, n).await;
        sleep(Duration::from_secs(5)).await;
        let ran = s.started.load(Ordering::SeqCst);
        let usage = s.usage();
        match (kind, &driven) {
            (_, Driven::Finished(out)) => {
                assert!(out.is_ok(), "{kind:?}, {n} polls");
                assert_eq!((ran, usage), (1, (1, 2)), "{kind:?}, {n} polls");
            }
            // Charged in `call`, before the first poll: charged once, never refunded.
            (Kind::Memory, Driven::Dropped) => {
                assert_eq!(
                    usage,
                    (1, 2),
                    "{kind:?}, dropped after {n} polls (tool ran {ran})"
                );
            }
            // Charged when the store answers: before that, neither charged nor run; after
            // it, charged once, whether the tool ran or not.
            (Kind::Slow, Driven::Dropped) => {
                assert!(
                    usage == (0, 0) || usage == (1, 2),
                    "{kind:?}, {n} polls: {usage:?}"
                );
                if ran > 0 {
                    assert_eq!(usage, (1, 2), "{kind:?}, {n} polls: the tool ran uncharged");
                }
            }
        }
        assert!(ran <= 1, "{kind:?}, {n} polls: the tool ran {ran} times");
        // The rest of the tool's budget is exactly what the charge left.
        let left = 3 - usage.0;
        for i in 0..left {
            let out = s.svc.clone().oneshot(req()).await;
            assert!(
                out.is_ok(),
                "{kind:?}, {n} polls: call {i} of the {left} left refused"
            );
        }
        let over = s.svc.clone().oneshot(req()).await;
        assert!(
            matches!(&over, Err(e) if e.kind() == ErrorKind::BudgetExhausted),
            "{kind:?}, {n} polls: a call past the limit got {over:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_at_any_await_is_charged_exactly_once_in_memory() {
    a_dropped_call_is_charged_once_or_not_at_all(Kind::Memory).await;
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_at_any_await_is_charged_once_or_not_at_all_with_a_store() {
    a_dropped_call_is_charged_once_or_not_at_all(Kind::Slow).await;
}

async fn concurrent_drops_never_pass_the_limit(kind: Kind) {
    for seed in 1..=20u64 {
        let mut rng = Rng::new(seed);
        let limit = 1 + rng.below(8);
        let s = Setup::new(kind, None, limit);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..30 {
            let fut = s.call(req()).await;
            let polls = usize::try_from(rng.below(5)).expect("small");
            let late = rng.millis(200);
            tasks.spawn(async move {
                sleep(late).await;
                drive(fut, polls).await
            });
        }
        let mut finished_ok = 0;
        while let Some(t) = tasks.join_next().await {
            if let Driven::Finished(Ok(_)) = t.expect("task") {
                finished_ok += 1;
            }
        }
        sleep(Duration::from_secs(5)).await;
        let (calls, cost) = s.usage();
        let ran = s.started.load(Ordering::SeqCst) as u64;
        assert!(
            calls <= limit,
            "{kind:?}, seed {seed}: {calls} calls charged, limit {limit}"
        );
        assert_eq!(cost, 2 * calls, "{kind:?}, seed {seed}");
        assert!(
            ran <= calls,
            "{kind:?}, seed {seed}: the tool ran {ran} times, {calls} charged"
        );
        assert!(finished_ok <= calls, "{kind:?}, seed {seed}");
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_dropped_at_random_awaits_never_pass_the_limit_in_memory() {
    concurrent_drops_never_pass_the_limit(Kind::Memory).await;
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_dropped_at_random_awaits_never_pass_the_limit_with_a_store() {
    concurrent_drops_never_pass_the_limit(Kind::Slow).await;
}

#[tokio::test(start_paused = true)]
async fn two_clones_of_one_request_sent_at_once_are_two_calls() {
    for kind in [Kind::Memory, Kind::Slow] {
        // Room for one: one clone runs, the other is refused.
        let s = Setup::new(kind, Some(1), 10);
        let r = req();
        let (a, b) = tokio::join!(s.svc.clone().oneshot(r.clone()), s.svc.clone().oneshot(r));
        let refused = [&a, &b]
            .iter()
            .filter(|o| matches!(o, Err(e) if e.kind() == ErrorKind::BudgetExhausted))
            .count();
        assert_eq!(refused, 1, "{kind:?}: {a:?} {b:?}");
        assert_eq!(s.usage(), (1, 2), "{kind:?}");
        // Room for two: both run, both counted.
        let s = Setup::new(kind, Some(2), 10);
        let r = req();
        let (a, b) = tokio::join!(s.svc.clone().oneshot(r.clone()), s.svc.clone().oneshot(r));
        assert!(a.is_ok() && b.is_ok(), "{kind:?}");
        assert_eq!(s.usage(), (2, 4), "{kind:?}");
        assert_eq!(s.started.load(Ordering::SeqCst), 2, "{kind:?}");
    }
}
