//! The retry budget: the fraction holds under sustained failure, the floor refills with
//! time, and every clone of the layer shares one bucket.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::read_request;
use toolshield_core::ErrorKind;
use toolshield_retry::{BackoffStrategy, BudgetConfig, RetryBudget, RetryConfig, RetryLayer};
use toolshield_test::ScriptedTool;
use tower::{Layer, ServiceExt};

/// Every call fails and wants one retry: the budget alone decides.
fn layer(budget: BudgetConfig) -> RetryLayer {
    RetryLayer::from_config(&RetryConfig {
        max_attempts: 2,
        backoff: BackoffStrategy::none(),
        budget,
        ..Default::default()
    })
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_fraction_holds_under_sustained_failure() {
    // 1000 failing calls over 10 s, through clones of one service.
    let layer = layer(BudgetConfig::default());

    let tool = ScriptedTool::always(ErrorKind::UpstreamUnavailable);
    let svc = layer.layer(tool.service());
    for _ in 0..1000 {
        let _ = svc.clone().oneshot(read_request()).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every call is one attempt plus at most one retry: the extra calls are the retries.
    let retries = tool.calls() - 1000;
    // 20 % of 1000 calls + 10/s over 10 s + the initial second of floor.
    let ceiling = 200 + 100 + 10;
    assert!(retries <= ceiling, "{retries} retries > {ceiling}");
    assert!(
        retries >= 280,
        "the budget must still allow its share: {retries}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fractional_ratio_never_rounds_up() {
    // 12.5 % and no floor: at most 125 retries for 1000 calls (a per-mille rounding bug
    // would allow one retry per call).
    let layer = layer(BudgetConfig {
        ratio: 0.125,
        min_per_sec: 0,
        ..Default::default()
    });
    let tool = ScriptedTool::always(ErrorKind::Timeout);
    let svc = layer.layer(tool.service());
    for _ in 0..1000 {
        let _ = svc.clone().oneshot(read_request()).await;
    }
    let retries = tool.calls() - 1000;
    assert!((120..=125).contains(&retries), "{retries}");
}

#[tokio::test(start_paused = true)]
async fn the_budget_is_shared_by_every_service_the_layer_builds() {
    let layer = layer(BudgetConfig {
        ratio: 0.0,
        min_per_sec: 1,
        burst: 1,
        ..Default::default()
    });
    let a = ScriptedTool::always(ErrorKind::Timeout);
    let b = ScriptedTool::always(ErrorKind::Timeout);
    let _ = layer.layer(a.service()).oneshot(read_request()).await;
    let _ = layer.layer(b.service()).oneshot(read_request()).await;
    assert_eq!(a.calls(), 2, "the one token went to the first service");
    assert_eq!(
        b.calls(),
        1,
        "the second service found the shared bucket empty"
    );
}

#[tokio::test(start_paused = true)]
async fn the_floor_refills_with_time_up_to_the_burst() {
    let budget = RetryBudget::new(0.0, 10, 20);
    assert_eq!(budget.available(), 10, "starts with one second of floor");
    for _ in 0..10 {
        assert!(budget.try_withdraw());
    }
    assert!(!budget.try_withdraw());
    tokio::time::advance(Duration::from_millis(500)).await;
    assert_eq!(budget.available(), 5);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(budget.available(), 20, "capped at the burst");
}

#[tokio::test(start_paused = true)]
async fn the_floor_refills_at_its_rate_however_often_the_budget_is_asked() {
    // One retry a second, asked about every 999 ns (a busy service failing fast): each
    // check covers less than a millionth of a token. The time between checks must still
    // add up, not be rounded away one check at a time.
    let budget = RetryBudget::new(0.0, 1, 10);
    assert!(budget.try_withdraw());
    assert!(!budget.try_withdraw());
    let step = Duration::from_nanos(999);
    let mut elapsed = Duration::ZERO;
    while elapsed < Duration::from_millis(1100) {
        tokio::time::advance(step).await;
        elapsed += step;
        let _ = budget.available();
    }
    assert_eq!(
        budget.available(),
        1,
        "1.1 s of a 1/s floor is one whole token"
    );
    assert!(budget.try_withdraw());
    assert!(!budget.try_withdraw());
}

#[tokio::test(start_paused = true)]
async fn deposits_are_capped_by_the_burst() {
    let budget = RetryBudget::new(0.5, 0, 3);
    for _ in 0..1000 {
        budget.deposit();
    }
    assert_eq!(budget.available(), 3);
    assert!(budget.try_withdraw() && budget.try_withdraw() && budget.try_withdraw());
    assert!(!budget.try_withdraw());
    budget.deposit();
    assert!(!budget.try_withdraw(), "half a token is not a retry");
    budget.deposit();
    assert!(budget.try_withdraw());
}

#[tokio::test(start_paused = true)]
async fn a_budget_can_be_shared_across_layers_or_disabled() {
    let shared = Arc::new(RetryBudget::new(0.0, 1, 1));
    let l1 = layer(BudgetConfig::default()).with_budget(Arc::clone(&shared));
    let l2 = layer(BudgetConfig::default()).with_budget(Arc::clone(&shared));
    let a = ScriptedTool::always(ErrorKind::Timeout);
    let b = ScriptedTool::always(ErrorKind::Timeout);
    let _ = l1.layer(a.service()).oneshot(read_request()).await;
    let _ = l2.layer(b.service()).oneshot(read_request()).await;
    assert_eq!((a.calls(), b.calls()), (2, 1));

    let unlimited = layer(BudgetConfig {
        enabled: false,
        ..Default::default()
    });
    assert!(unlimited.budget().is_none());
    let c = ScriptedTool::always(ErrorKind::Timeout);
    let svc = unlimited.layer(c.service());
    for _ in 0..100 {
        let _ = svc.clone().oneshot(read_request()).await;
    }
    assert_eq!(c.calls(), 200, "without a budget every call is retried");
}

#[test]
fn budget_concurrent_withdrawals_never_overspend() {
    let budget = Arc::new(RetryBudget::new(1.0, 0, 1000));
    for _ in 0..500 {
        budget.deposit();
    }
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let b = Arc::clone(&budget);
            std::thread::spawn(move || (0..1000).filter(|_| b.try_withdraw()).count())
        })
        .collect();
    let granted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(granted, 500);
}
