//! A run's budget holds while the run is in use: a flood of other run ids (one-off ids an
//! agent or an attacker makes up) forgets the least recently charged runs, never a run
//! that keeps calling; a refused call never reaches the tool, whichever limit refused
//! it; and a run's counters live exactly `run_ttl` after its last call. Paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_budget::{BudgetLayer, BudgetLedger, LedgerConfig, WithoutRun, MAX_ID_LEN};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{BareTool, CountingTool};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

type Tool = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

fn req(run: &str) -> ToolRequest {
    ToolRequest::new("search", json!({})).run_id(run)
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_new_run_ids_never_resets_a_run_that_keeps_calling() {
    const MAX_RUNS: u64 = 100;
    let ledger = BudgetLedger::from_config(&LedgerConfig {
        run_max_calls: Some(3),
        max_runs: MAX_RUNS,
        ..LedgerConfig::default()
    })
    .unwrap();
    let t: Tool =
        BoxCloneSyncService::new(BudgetLayer::new(&ledger, "search", None).layer(BareTool));
    let mut admitted = 0;
    for n in 0..20_000u32 {
        // The run in use calls between every two new runs: it is never among the least
        // recently charged.
        if n % 2 == 0 && t.clone().oneshot(req("agent-run")).await.is_ok() {
            admitted += 1;
        }
        assert!(t
            .clone()
            .oneshot(req(&format!("one-off-{n}")))
            .await
            .is_ok());
    }
    assert_eq!(
        admitted, 3,
        "the run in use was forgotten and started again from zero"
    );
    let runs = ledger.memory_store().unwrap().runs();
    assert!(runs <= MAX_RUNS, "{runs} runs held, bound {MAX_RUNS}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_never_reaches_the_tool_whichever_limit_refused_it() {
    let calls = Arc::new(AtomicUsize::new(0));
    let ledger = BudgetLedger::from_config(&LedgerConfig {
        run_max_calls: Some(4),
        run_max_cost: Some(10),
        without_run: WithoutRun::Reject,
        ..LedgerConfig::default()
    })
    .unwrap();
    let counting =
        || CountingTool::with_counter(&calls, |_n: usize| Ok(ToolResponse::new(json!("ok"))));
    let one: Tool =
        BoxCloneSyncService::new(BudgetLayer::new(&ledger, "one", Some(1)).layer(counting()));
    let dear: Tool = BoxCloneSyncService::new(
        BudgetLayer::new(&ledger, "dear", None)
            .cost(6)
            .layer(counting()),
    );
    let cheap: Tool =
        BoxCloneSyncService::new(BudgetLayer::new(&ledger, "cheap", None).layer(counting()));
    let run = |tool: &str, r: &str| ToolRequest::new(tool, json!({})).run_id(r);

    let mut expect = 0;
    let mut check = |out: Result<ToolResponse, ToolError>, refused: Option<ErrorKind>| {
        match refused {
            None => {
                assert!(out.is_ok(), "{out:?}");
                expect += 1;
            }
            Some(kind) => assert_eq!(out.unwrap_err().kind(), kind),
        }
        assert_eq!(calls.load(Ordering::SeqCst), expect, "a refused call ran");
    };
    check(one.clone().oneshot(run("one", "r")).await, None);
    // The tool's own limit.
    check(
        one.clone().oneshot(run("one", "r")).await,
        Some(ErrorKind::BudgetExhausted),
    );
    check(dear.clone().oneshot(run("dear", "r")).await, None);
    // The run's cost: 6 + 6 > 10.
    check(
        dear.clone().oneshot(run("dear", "r")).await,
        Some(ErrorKind::BudgetExhausted),
    );
    check(cheap.clone().oneshot(run("cheap", "r")).await, None);
    check(cheap.clone().oneshot(run("cheap", "r")).await, None);
    // The run's calls: 4 used.
    check(
        cheap.clone().oneshot(run("cheap", "r")).await,
        Some(ErrorKind::BudgetExhausted),
    );
    // No run id, and a run id too long.
    check(
        cheap
            .clone()
            .oneshot(ToolRequest::new("cheap", json!({})))
            .await,
        Some(ErrorKind::InvalidInput),
    );
    let long = "r".repeat(MAX_ID_LEN + 1);
    check(
        cheap.clone().oneshot(run("cheap", &long)).await,
        Some(ErrorKind::InvalidInput),
    );
    // An id of exactly the longest length, control characters included, is a run.
    let edge = format!("\u{0}\u{1b}[2J{}", "r".repeat(MAX_ID_LEN - 5));
    assert_eq!(edge.len(), MAX_ID_LEN);
    check(cheap.clone().oneshot(run("cheap", &edge)).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_runs_counters_live_exactly_run_ttl_after_its_last_call() {
    let ttl = Duration::from_secs(60);
    let ledger = BudgetLedger::from_config(&LedgerConfig {
        run_max_calls: Some(1),
        run_ttl: ttl,
        ..LedgerConfig::default()
    })
    .unwrap();
    let t: Tool =
        BoxCloneSyncService::new(BudgetLayer::new(&ledger, "search", None).layer(BareTool));
    assert!(t.clone().oneshot(req("r")).await.is_ok());
    tokio::time::advance(ttl - Duration::from_nanos(1)).await;
    // Still within its TTL: exhausted, and this refused call refreshes the TTL.
    assert_eq!(
        t.clone().oneshot(req("r")).await.unwrap_err().kind(),
        ErrorKind::BudgetExhausted
    );
    tokio::time::advance(ttl - Duration::from_nanos(1)).await;
    assert!(
        t.clone().oneshot(req("r")).await.is_err(),
        "refreshed by the refused call"
    );
    tokio::time::advance(ttl).await;
    assert!(
        t.clone().oneshot(req("r")).await.is_ok(),
        "idle for exactly run_ttl: a fresh budget"
    );
}
