//! The hedge budget (docs/hedging.md, "Budget"): a budget given with `with_own_budget`
//! receives a deposit from every call the layer may hedge (tower's `Budget` discipline:
//! deposit per request, withdraw per extra attempt); a budget shared with a retry layer
//! through `with_budget` is fed by that layer only, so the hedging layer never deposits
//! into it. On tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_core::{CallKind, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_retry::RetryBudget;
use toolshield_test::ScriptedTool;
use tower::{Layer, ServiceExt};

fn read() -> ToolRequest {
    ToolRequest::new("search", json!({"q": 1})).kind(CallKind::ReadOnly)
}

/// Two calls whose first attempt is slower than the delay and whose hedge is fast.
fn slow_first_twice() -> ScriptedTool {
    let slow = || {
        (
            Duration::from_secs(1),
            Ok(ToolResponse::new(json!({"by": 1}))),
        )
    };
    let fast = || {
        (
            Duration::from_millis(1),
            Ok(ToolResponse::new(json!({"by": 2}))),
        )
    };
    // Call 1: slow first attempt (and a fast hedge, if one is sent); call 2 likewise.
    ScriptedTool::steps([slow(), fast(), slow(), fast()])
}

#[tokio::test(start_paused = true)]
async fn an_owned_budget_earns_a_hedge_from_the_calls_deposits() {
    // Half a token per call, no floor: the first call cannot hedge, the second can.
    let budget = Arc::new(RetryBudget::new(0.5, 0, 10));
    assert_eq!(budget.available(), 0);
    let layer =
        HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 1).with_own_budget(budget);
    let tool = slow_first_twice();
    let svc = layer.layer(tool.service());

    let first = svc.oneshot(read()).await.unwrap();
    assert_eq!(
        first.output,
        json!({"by": 1}),
        "half a token sends no hedge"
    );
    assert_eq!(layer.stats().budget_denied(), 1);

    // A fresh script for the second call (the first call's hedge step was never used).
    let tool = slow_first_twice();
    let svc = layer.layer(tool.service());
    let second = svc.oneshot(read()).await.unwrap();
    assert_eq!(
        second.output,
        json!({"by": 2}),
        "two deposits pay for a hedge"
    );
    assert_eq!(layer.stats().hedges_sent(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_shared_budget_gets_no_deposit_from_the_hedging_layer() {
    let budget = Arc::new(RetryBudget::new(0.5, 0, 10));
    let layer = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 1)
        .with_budget(budget.clone());
    for _ in 0..4 {
        let tool = slow_first_twice();
        let res = layer.layer(tool.service()).oneshot(read()).await.unwrap();
        assert_eq!(res.output, json!({"by": 1}));
    }
    assert_eq!(layer.stats().hedges_sent(), 0);
    assert_eq!(layer.stats().budget_denied(), 4);
    assert_eq!(budget.available(), 0);
}
