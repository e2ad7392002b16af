//! One budget for retries and hedges (docs/hedging.md, "Budget"; docs/retry.md, "Retry
//! budget"): as with tower's `Budget`, every call deposits a fraction of a token (through
//! the retry layer) and every extra attempt, retry or hedge, withdraws a whole one. Under a
//! burst of failing calls the extra attempts never exceed `ratio × calls` (no floor here),
//! and the budget is spent in full. On tokio's paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_retry::{BackoffStrategy, RetryBudget, RetryLayer};
use toolshield_test::counting_tool;
use tower::{Layer, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_burst_of_failing_calls_spends_exactly_the_budgets_fraction_on_extra_attempts() {
    const CALLS: usize = 500;
    // 20 % of the calls, no floor, room for every deposit.
    let budget = Arc::new(RetryBudget::new(0.2, 0, 1_000));
    let calls = Arc::new(AtomicUsize::new(0));
    // Every attempt fails after 50 ms, slower than the 10 ms hedge delay.
    let tool = counting_tool(&calls, Duration::from_millis(50), |_| {
        Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
    });
    let hedge = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(10)), 2)
        .with_budget(budget.clone());
    let retry = RetryLayer::new(3)
        .with_backoff(BackoffStrategy::none())
        .with_budget(budget.clone());
    let svc = retry.layer(hedge.layer(tool));

    let mut tasks = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let req = ToolRequest::new("search", json!({ "i": i })).kind(CallKind::ReadOnly);
        tasks.push(tokio::spawn(svc.clone().oneshot(req)));
    }
    for task in tasks {
        let err = task.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    }

    let extra = calls.load(Ordering::SeqCst) - CALLS;
    assert_eq!(
        extra,
        CALLS / 5,
        "retries and hedges together spend exactly 20 % of the calls"
    );
    assert_eq!(budget.available(), 0);
    assert!(hedge.stats().hedges_sent() > 0, "hedges took their share");
}
