//! Behaviour of the budget layer with the in-memory ledger, and with a store behind the
//! trait (a failing one, a slow one).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use toolshield_budget::{
    BudgetConfig, BudgetKey, BudgetLayer, BudgetLedger, BudgetStore, Charge, LedgerConfig, Limit,
    MemoryBudgetStore, OnStoreError, Scope, StoreError, StoreFuture, Verdict, WithoutRun,
    MAX_ID_LEN,
};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{problem_fields, BareTool, CountingTool};
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

type Tool = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

fn tool(ledger: &BudgetLedger, name: &str, max_calls: Option<u64>, cost: u64) -> Tool {
    BoxCloneSyncService::new(
        BudgetLayer::new(ledger, name, max_calls)
            .cost(cost)
            .layer(BareTool),
    )
}

fn req(tool: &str, run: &str) -> ToolRequest {
    ToolRequest::new(tool, json!({})).run_id(run)
}

async fn call(svc: &Tool, r: ToolRequest) -> Result<ToolResponse, ToolError> {
    svc.clone().oneshot(r).await
}

async fn count_ok(svc: &Tool, tool_name: &str, run: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if call(svc, req(tool_name, run)).await.is_ok() {
            ok += 1;
        }
    }
    ok
}

#[tokio::test]
async fn per_tool_limit_admits_exactly_max_calls_then_budget_exhausted() {
    let ledger = BudgetLedger::new();
    let search = tool(&ledger, "search", Some(3), 0);
    assert_eq!(count_ok(&search, "search", "run-1", 3).await, 3);
    let err = call(&search, req("search", "run-1")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    assert!(!err.kind().is_retriable());
    assert!(!err.kind().counts_for_breaker());
    assert!(err.message().contains("tool `search`"), "{}", err.message());
    assert!(err.message().contains("3 calls"), "{}", err.message());
    assert!(
        !err.message().contains("run-1"),
        "the run id is never echoed"
    );
    assert!(err.kind().for_model("search").contains("Do not call"));
    let stats = &ledger.stats()[0];
    assert_eq!(stats.admitted(), 3);
    assert_eq!(stats.exhausted(Limit::ToolCalls), 1);
}

#[tokio::test]
async fn run_total_is_shared_across_tools() {
    let ledger = BudgetLedger::new().run_max_calls(5);
    let search = tool(&ledger, "search", Some(4), 0);
    let fetch = tool(&ledger, "fetch", None, 0);
    assert_eq!(count_ok(&search, "search", "r", 3).await, 3);
    assert_eq!(count_ok(&fetch, "fetch", "r", 5).await, 2);
    let err = call(&search, req("search", "r")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    assert!(
        err.message().contains("5 calls across tools"),
        "{}",
        err.message()
    );
    let store = ledger.memory_store().unwrap();
    let key = BudgetKey::new(Scope::Run, Some("r"), None)
        .unwrap()
        .encoded();
    assert_eq!(store.usage(&key), Some((5, 0)));
    assert_eq!(store.tool_calls(&key, "search"), Some(3));
    assert_eq!(store.tool_calls(&key, "fetch"), Some(2));
}

#[tokio::test]
async fn cost_limit_rejects_a_call_that_does_not_fit_and_charges_nothing_for_it() {
    let ledger = BudgetLedger::new().run_max_cost(12);
    let expensive = tool(&ledger, "llm", None, 5);
    let cheap = tool(&ledger, "lookup", None, 1);
    assert_eq!(count_ok(&expensive, "llm", "r", 2).await, 2); // 10 used
    let err = call(&expensive, req("llm", "r")).await.unwrap_err(); // 15 > 12
    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    assert!(err.message().contains("12 cost units"), "{}", err.message());
    // The rejected call cost nothing: two units are still there for the cheap tool.
    assert_eq!(count_ok(&cheap, "lookup", "r", 3).await, 2);
    let key = BudgetKey::new(Scope::Run, Some("r"), None)
        .unwrap()
        .encoded();
    assert_eq!(ledger.memory_store().unwrap().usage(&key), Some((4, 12)));
    assert_eq!(ledger.stats()[0].exhausted(Limit::RunCost), 1);
}

#[tokio::test]
async fn a_call_rejected_by_one_limit_is_not_counted_by_the_others() {
    let ledger = BudgetLedger::new().run_max_calls(3);
    let a = tool(&ledger, "a", Some(1), 0);
    let b = tool(&ledger, "b", None, 0);
    assert_eq!(count_ok(&a, "a", "r", 5).await, 1);
    // Four rejections of `a` took nothing from the run's total.
    assert_eq!(count_ok(&b, "b", "r", 5).await, 2);
}

#[tokio::test]
async fn runs_are_isolated() {
    let ledger = BudgetLedger::new().run_max_calls(2);
    let t = tool(&ledger, "t", None, 0);
    assert_eq!(count_ok(&t, "t", "run-a", 5).await, 2);
    assert_eq!(count_ok(&t, "t", "run-b", 5).await, 2);
    assert_eq!(
        call(&t, req("t", "run-a")).await.unwrap_err().kind(),
        ErrorKind::BudgetExhausted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_calls_against_ten_admit_exactly_ten() {
    let ledger = BudgetLedger::new().run_max_calls(10);
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = CountingTool::with_counter(&calls, |_| Ok(ToolResponse::new(json!(1))))
        .delay(Duration::from_millis(5));
    let svc = BudgetLayer::new(&ledger, "t", Some(50)).layer(inner.boxed());
    let gate = Arc::new(tokio::sync::Barrier::new(100));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let svc = svc.clone();
        let gate = Arc::clone(&gate);
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            svc.oneshot(req("t", "shared-run")).await
        }));
    }
    let mut ok = 0;
    let mut exhausted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) if e.kind() == ErrorKind::BudgetExhausted => exhausted += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!((ok, exhausted), (10, 90));
    assert_eq!(calls.load(Ordering::SeqCst), 10);
}

#[tokio::test]
async fn nested_calls_of_one_run_share_its_budget() {
    // A tool that calls another tool of the same run from inside (an agent calling a
    // sub-agent): the inner calls are counted against the same run total.
    let ledger = BudgetLedger::new().run_max_calls(3);
    let leaf = tool(&ledger, "leaf", None, 0);
    let leaf2 = leaf.clone();
    let outer =
        BudgetLayer::new(&ledger, "outer", None).layer(tower::service_fn(move |r: ToolRequest| {
            let leaf = leaf2.clone();
            async move {
                let run = r.meta().run_id.clone().unwrap_or_default();
                let mut ok = 0;
                for _ in 0..5 {
                    if leaf.clone().oneshot(req("leaf", &run)).await.is_ok() {
                        ok += 1;
                    }
                }
                Ok::<_, ToolError>(ToolResponse::new(json!(ok)))
            }
        }));
    let resp = outer.clone().oneshot(req("outer", "r")).await.unwrap();
    assert_eq!(
        resp.output,
        json!(2),
        "one call for outer, two left for leaf"
    );
    assert!(call(&leaf, req("leaf", "r")).await.is_err());
}

#[tokio::test]
async fn failed_calls_are_not_refunded() {
    let ledger = BudgetLedger::new();
    let failing = BoxCloneSyncService::new(BudgetLayer::new(&ledger, "f", Some(2)).layer(
        tower::service_fn(|_r: ToolRequest| async {
            Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
        }),
    ));
    for _ in 0..2 {
        let e = call(&failing, req("f", "r")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
    }
    let e = call(&failing, req("f", "r")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_counts_and_leaves_nothing_running() {
    let ledger = BudgetLedger::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = CountingTool::with_counter(&calls, |_| Ok(ToolResponse::new(json!(1))))
        .delay(Duration::from_secs(10));
    let mut svc = BudgetLayer::new(&ledger, "slow", Some(2)).layer(inner.boxed());
    // Admitted when called, then dropped (cancelled) before it finishes.
    let fut = svc.ready().await.unwrap().call(req("slow", "r"));
    drop(fut);
    let fut = tokio::time::timeout(
        Duration::from_secs(1),
        svc.ready().await.unwrap().call(req("slow", "r")),
    );
    assert!(fut.await.is_err(), "timed out");
    let e = svc
        .ready()
        .await
        .unwrap()
        .call(req("slow", "r"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
    let key = BudgetKey::new(Scope::Run, Some("r"), None)
        .unwrap()
        .encoded();
    assert_eq!(ledger.memory_store().unwrap().usage(&key), Some((2, 0)));
}

#[tokio::test(start_paused = true)]
async fn counters_expire_after_the_idle_ttl_and_each_call_refreshes_it() {
    let cfg = LedgerConfig {
        run_max_calls: Some(2),
        run_ttl: Duration::from_secs(60),
        ..LedgerConfig::default()
    };
    let ledger = BudgetLedger::from_config(&cfg).unwrap();
    let t = tool(&ledger, "t", None, 0);
    assert_eq!(count_ok(&t, "t", "r", 2).await, 2);
    // Rejected calls keep the run alive too: a run hammering after exhaustion stays
    // exhausted.
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(45)).await;
        assert!(call(&t, req("t", "r")).await.is_err());
    }
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(call(&t, req("t", "r")).await.is_err());
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(
        count_ok(&t, "t", "r", 3).await,
        2,
        "a fresh budget after 60 s idle"
    );
}

#[tokio::test]
async fn calls_without_a_run_are_unlimited_by_default_and_rejected_when_configured() {
    let ledger = BudgetLedger::new().run_max_calls(1);
    let t = tool(&ledger, "t", Some(1), 0);
    for _ in 0..5 {
        call(&t, ToolRequest::new("t", json!({}))).await.unwrap();
    }
    assert_eq!(ledger.stats()[0].without_run(), 5);

    let strict = BudgetLedger::new().without_run(WithoutRun::Reject);
    let t = tool(&strict, "t", Some(1), 0);
    let e = call(&t, ToolRequest::new("t", json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.message().contains("no run id"), "{}", e.message());
    assert!(call(&t, req("t", "r")).await.is_ok());
}

#[tokio::test]
async fn caller_scope_counts_across_runs_and_run_and_caller_separates_callers() {
    let by_caller = BudgetLedger::new()
        .scope(Scope::Caller)
        .run_max_calls(2)
        .without_run(WithoutRun::Reject);
    let t = tool(&by_caller, "t", None, 0);
    let alice = |run: &str| req("t", run).caller("alice");
    assert!(call(&t, alice("r1")).await.is_ok());
    assert!(call(&t, alice("r2")).await.is_ok());
    assert!(
        call(&t, alice("r3")).await.is_err(),
        "alice's budget spans runs"
    );
    assert!(call(&t, req("t", "r1").caller("bob")).await.is_ok());
    let e = call(&t, req("t", "r1")).await.unwrap_err();
    assert!(e.message().contains("no caller id"), "{}", e.message());

    let both = BudgetLedger::new()
        .scope(Scope::RunAndCaller)
        .run_max_calls(1);
    let t = tool(&both, "t", None, 0);
    assert!(call(&t, req("t", "r").caller("alice")).await.is_ok());
    assert!(call(&t, req("t", "r").caller("alice")).await.is_err());
    assert!(call(&t, req("t", "r").caller("bob")).await.is_ok());
    // No caller: a budget of its own, not alice's, not bob's, and not unlimited.
    assert!(call(&t, req("t", "r")).await.is_ok());
    assert!(call(&t, req("t", "r")).await.is_err());
}

#[tokio::test]
async fn hostile_run_ids_are_kept_apart_and_too_long_ones_rejected() {
    let ledger = BudgetLedger::new().run_max_calls(1);
    let t = tool(&ledger, "t", None, 0);
    let ids = [
        "a}b",
        "a{b",
        "{a}",
        "a\nb",
        "a\u{0}b",
        "a\u{1b}[31mb",
        "r:a",
        "b:1:a:-",
        "",
        "%7D",
    ];
    for id in ids {
        assert!(call(&t, req("t", id)).await.is_ok(), "{id:?}");
    }
    for id in ids {
        let e = call(&t, req("t", id)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BudgetExhausted, "{id:?}");
        if !id.is_empty() {
            assert!(!e.message().contains(id), "{id:?} echoed");
        }
    }
    let longest = "x".repeat(MAX_ID_LEN);
    assert!(call(&t, req("t", &longest)).await.is_ok());
    let too_long = "y".repeat(MAX_ID_LEN + 1);
    let e = call(&t, req("t", &too_long)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(!e.message().contains("yyyy"));
    let huge = "z".repeat(1 << 20);
    let e = call(&t, req("t", &huge)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
}

#[tokio::test]
async fn a_hundred_thousand_run_ids_stay_within_max_runs() {
    let cfg = LedgerConfig {
        max_runs: 1_000,
        run_max_calls: Some(1),
        ..LedgerConfig::default()
    };
    let ledger = BudgetLedger::from_config(&cfg).unwrap();
    let mut svc = BudgetLayer::new(&ledger, "t", None).layer(BareTool);
    let store = ledger.memory_store().unwrap();
    for i in 0..100_000u32 {
        let id = format!("attacker-{i}-{}", "{".repeat((i % 7) as usize));
        svc.ready()
            .await
            .unwrap()
            .call(req("t", &id))
            .await
            .unwrap();
        if i % 10_000 == 0 {
            assert!(store.runs() <= 1_000, "{} runs", store.runs());
        }
    }
    assert!(store.runs() <= 1_000, "{} runs", store.runs());
}

#[tokio::test]
async fn from_config_builds_the_layer_and_lists_every_problem() {
    let ledger = BudgetLedger::from_config(&LedgerConfig {
        run_max_cost: Some(10),
        ..LedgerConfig::default()
    })
    .unwrap();
    let layer = BudgetLayer::from_config(
        &ledger,
        "pay",
        &BudgetConfig {
            max_calls: Some(1),
            cost: 4,
        },
    )
    .unwrap();
    let svc = BoxCloneSyncService::new(layer.layer(BareTool));
    assert!(call(&svc, req("pay", "r")).await.is_ok());
    assert!(call(&svc, req("pay", "r")).await.is_err());

    let bad = LedgerConfig {
        run_max_calls: Some(u64::MAX),
        run_max_cost: Some(1 << 60),
        run_ttl: Duration::ZERO,
        max_runs: 0,
        ..LedgerConfig::default()
    };
    let err = BudgetLedger::from_config(&bad).unwrap_err();
    assert_eq!(
        problem_fields(&err),
        ["run_max_calls", "run_max_cost", "run_ttl", "max_runs"]
    );
    let err = BudgetLayer::from_config(
        &ledger,
        " ",
        &BudgetConfig {
            max_calls: Some(u64::MAX),
            cost: u64::MAX,
        },
    )
    .unwrap_err();
    assert_eq!(problem_fields(&err), ["tool", "max_calls", "cost"]);
}

#[test]
fn config_parses_every_key_and_rejects_unknown_ones() {
    let cfg: LedgerConfig = serde_json::from_str(
        r#"{"scope": "caller", "run_max_calls": 5, "run_max_cost": 9, "run_ttl": "10m",
            "max_runs": 7, "without_run": "reject", "on_store_error": "allow"}"#,
    )
    .unwrap();
    assert_eq!(cfg.scope, Scope::Caller);
    assert_eq!(cfg.run_ttl, Duration::from_secs(600));
    assert_eq!(cfg.without_run, WithoutRun::Reject);
    assert_eq!(cfg.on_store_error, OnStoreError::Allow);
    assert_eq!(cfg.max_runs, 7);
    let d = LedgerConfig::default();
    assert_eq!(
        (d.scope, d.run_ttl, d.without_run, d.on_store_error),
        (
            Scope::Run,
            Duration::from_secs(3600),
            WithoutRun::Allow,
            OnStoreError::Reject
        )
    );
    assert!(serde_json::from_str::<LedgerConfig>(r#"{"max_call": 1}"#).is_err());
    assert!(serde_json::from_str::<BudgetConfig>(r#"{"costs": 1}"#).is_err());
    assert!(serde_json::from_str::<LedgerConfig>(r#"{"scope": "tenant"}"#).is_err());
}

#[test]
fn budget_keys_are_injective_across_scopes() {
    let cases = [
        (Scope::Run, Some("a"), None),
        (Scope::Caller, None, Some("a")),
        (Scope::RunAndCaller, Some("a"), None),
        (Scope::RunAndCaller, Some("a"), Some("")),
        (Scope::RunAndCaller, Some("a:s1:b"), None),
        (Scope::RunAndCaller, Some("a"), Some("b")),
        (Scope::RunAndCaller, Some("a:"), Some("b")),
        (Scope::RunAndCaller, Some("1:a"), Some("b")),
    ];
    let keys: Vec<String> = cases
        .iter()
        .map(|(s, r, c)| BudgetKey::new(*s, *r, *c).unwrap().encoded())
        .collect();
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "{keys:?}");
}

/// A store that fails every charge.
#[derive(Debug)]
struct DownStore;

impl BudgetStore for DownStore {
    fn charge<'a>(&'a self, _charge: Charge<'a>) -> StoreFuture<'a, Verdict> {
        Box::pin(async { Err(StoreError::new("connection refused")) })
    }
}

#[tokio::test]
async fn a_failing_store_rejects_by_default_and_allows_when_configured() {
    let ledger = BudgetLedger::with_store(&LedgerConfig::default(), Arc::new(DownStore)).unwrap();
    let t = tool(&ledger, "t", Some(1), 0);
    let e = call(&t, req("t", "r")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreUnavailable);
    assert_eq!(ledger.stats()[0].store_errors(), 1);

    let cfg = LedgerConfig {
        on_store_error: OnStoreError::Allow,
        ..LedgerConfig::default()
    };
    let open = BudgetLedger::with_store(&cfg, Arc::new(DownStore)).unwrap();
    let t = tool(&open, "t", Some(1), 0);
    for _ in 0..3 {
        assert!(call(&t, req("t", "r")).await.is_ok());
    }
    assert_eq!(open.stats()[0].store_errors(), 3);
}

/// A memory store whose charges wait for a signal (a slow Redis).
#[derive(Debug)]
struct SlowStore {
    inner: MemoryBudgetStore,
    go: Arc<Notify>,
}

impl BudgetStore for SlowStore {
    fn charge<'a>(&'a self, charge: Charge<'a>) -> StoreFuture<'a, Verdict> {
        Box::pin(async move {
            self.go.notified().await;
            self.inner.charge_now(&charge)
        })
    }
}

#[tokio::test]
async fn a_call_dropped_while_the_store_answers_never_runs() {
    let go = Arc::new(Notify::new());
    let store = Arc::new(SlowStore {
        inner: MemoryBudgetStore::new(10),
        go: Arc::clone(&go),
    });
    let ledger = BudgetLedger::with_store(&LedgerConfig::default(), store.clone()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = CountingTool::with_counter(&calls, |_| Ok(ToolResponse::new(json!(1))));
    let mut svc = BudgetLayer::new(&ledger, "t", Some(1)).layer(inner.boxed());
    let fut = svc.ready().await.unwrap().call(req("t", "r"));
    let pending = tokio::time::timeout(Duration::from_millis(10), fut).await;
    assert!(pending.is_err(), "waits for the store");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The store path charges, then runs the call.
    let fut = svc.ready().await.unwrap().call(req("t", "r2"));
    go.notify_one();
    fut.await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // A dropped charge never reached the store: run `r` is untouched.
    let key = BudgetKey::new(Scope::Run, Some("r"), None)
        .unwrap()
        .encoded();
    assert_eq!(store.inner.usage(&key), None);
}

#[tokio::test]
async fn store_path_admits_exactly_the_limit() {
    let store = Arc::new(MemoryBudgetStore::new(100));
    let ledger = BudgetLedger::with_store(&LedgerConfig::default(), store).unwrap();
    let t = tool(&ledger, "t", Some(4), 0);
    assert_eq!(count_ok(&t, "t", "r", 10).await, 4);
    assert_eq!(ledger.stats()[0].admitted(), 4);
    assert_eq!(ledger.stats()[0].exhausted(Limit::ToolCalls), 6);
}

#[tokio::test]
async fn readiness_is_the_inner_services_and_rejection_happens_in_call() {
    let ledger = BudgetLedger::new();
    let (mock, mut handle) = tower_test_like::pair();
    let mut svc = BudgetLayer::new(&ledger, "t", Some(0)).layer(mock);
    handle.allow(0);
    assert!(futures_poll_ready(&mut svc).is_pending());
    handle.allow(1);
    assert!(futures_poll_ready(&mut svc).is_ready());
    let e = svc.call(req("t", "r")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
}

fn futures_poll_ready<S: Service<ToolRequest>>(svc: &mut S) -> std::task::Poll<()> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    svc.poll_ready(&mut cx).map(|_| ())
}

/// A minimal service whose readiness the test controls.
mod tower_test_like {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use toolshield_core::{ToolError, ToolRequest, ToolResponse};

    #[derive(Clone)]
    pub(crate) struct Gated(Arc<AtomicUsize>);
    pub(crate) struct Handle(Arc<AtomicUsize>);

    pub(crate) fn pair() -> (Gated, Handle) {
        let n = Arc::new(AtomicUsize::new(0));
        (Gated(Arc::clone(&n)), Handle(n))
    }

    impl Handle {
        pub(crate) fn allow(&mut self, n: usize) {
            self.0.store(n, Ordering::SeqCst);
        }
    }

    impl tower::Service<ToolRequest> for Gated {
        type Response = ToolResponse;
        type Error = ToolError;
        type Future = std::future::Ready<Result<ToolResponse, ToolError>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
            if self.0.load(Ordering::SeqCst) > 0 {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }

        fn call(&mut self, _req: ToolRequest) -> Self::Future {
            std::future::ready(Ok(ToolResponse::new(serde_json::json!(true))))
        }
    }
}
