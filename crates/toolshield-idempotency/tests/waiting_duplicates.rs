//! A duplicate that waits for a running call (`OnPending::Wait`): what ends its wait, and
//! that it never runs the tool while the first call still holds the key. Paused clock.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, Instant};
use toolshield_core::faults::Fault;
use toolshield_core::{
    CallKind, CancellationToken, ErrorKind, ToolError, ToolRequest, ToolResponse,
};
use toolshield_idempotency::{IdempotencyConfig, OnPending, OnStoreError, RecordStatus};
use tower::{Layer, ServiceExt};

use support::{faulty, ok_n, tool_watching_token, Runs};

/// The first run fails retriably (the key is released); later runs succeed.
fn unavailable_then_ok(n: usize) -> Result<ToolResponse, ToolError> {
    if n == 1 {
        Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
    } else {
        ok_n(n)
    }
}

fn pay() -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": 42}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-7")
}

fn waiting() -> IdempotencyConfig {
    IdempotencyConfig {
        on_pending: OnPending::Wait,
        wait_timeout: Duration::from_secs(10),
        ..IdempotencyConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_poll_fails_under_fail_open_never_runs_beside_the_owner() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, plan) = faulty(IdempotencyConfig {
        on_store_error: OnStoreError::FailOpen,
        ..waiting()
    });
    let slow = tool_watching_token(&runs, Duration::from_secs(2), ok_n);
    let first = tokio::spawn(layer.layer(slow.clone()).oneshot(pay()));
    sleep(Duration::from_millis(10)).await;
    // The duplicate's first read finds the running claim; its second read fails.
    plan.nth("claim", 1, Fault::Fail);
    let dup = tokio::spawn(layer.layer(slow.clone()).oneshot(pay()));
    let first = first.await.expect("join").expect("the first call succeeds");
    let dup = dup.await.expect("join");
    assert_eq!(
        runs.max_running.load(Ordering::SeqCst),
        1,
        "the duplicate never ran beside the owner"
    );
    assert_eq!(runs.started.load(Ordering::SeqCst), 1, "one execution");
    let dup = dup.expect("the duplicate gets the first call's result once the store answers");
    assert!(dup.provenance.replayed);
    assert_eq!(dup.output, first.output);
    assert!(handle.counts().store_errors >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_under_fail_open_whose_store_stays_down_ends_in_progress() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, plan) = faulty(IdempotencyConfig {
        on_store_error: OnStoreError::FailOpen,
        ..waiting()
    });
    let slow = tool_watching_token(&runs, Duration::from_secs(30), ok_n);
    let first = tokio::spawn(layer.layer(slow.clone()).oneshot(pay()));
    sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    let dup = tokio::spawn(layer.layer(slow.clone()).oneshot(pay()));
    // The duplicate's first read finds the running claim; every read after it fails.
    sleep(Duration::from_millis(10)).await;
    plan.always("claim", Fault::Fail);
    let dup = dup.await.expect("join");
    assert_eq!(dup.expect_err("not run").kind(), ErrorKind::InProgress);
    assert!(started.elapsed() <= Duration::from_secs(10), "bounded wait");
    assert_eq!(runs.started.load(Ordering::SeqCst), 1, "one execution");
    assert_eq!(handle.counts().in_progress, 1);
    plan.clear();
    first.await.expect("join").expect("the first call succeeds");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_cancelled_while_it_waits_ends_cancelled_and_never_claims() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, _plan) = faulty(waiting());
    let slow = tool_watching_token(&runs, Duration::from_secs(2), unavailable_then_ok);
    let first = tokio::spawn(layer.layer(slow.clone()).oneshot(pay()));
    sleep(Duration::from_millis(10)).await;
    let token = CancellationToken::new();
    let dup = tokio::spawn(
        layer
            .layer(slow.clone())
            .oneshot(pay().cancel_token(token.clone())),
    );
    sleep(Duration::from_millis(500)).await;
    let cancelled_at = Instant::now();
    token.cancel();
    let dup = dup.await.expect("join");
    assert!(
        cancelled_at.elapsed() < Duration::from_millis(100),
        "the wait ends when the call is cancelled"
    );
    assert_eq!(dup.expect_err("cancelled").kind(), ErrorKind::Cancelled);
    // The first call fails retriably and frees the key; the cancelled duplicate does not
    // take it (which would call the tool with a cancelled token and keep the key
    // OUTCOME_UNKNOWN for a day).
    let first = first.await.expect("join");
    assert_eq!(
        first.expect_err("503").kind(),
        ErrorKind::UpstreamUnavailable
    );
    sleep(Duration::from_secs(1)).await;
    assert_eq!(runs.started.load(Ordering::SeqCst), 1, "one execution");
    assert!(
        handle
            .record("pay", None, "order-7")
            .await
            .expect("get")
            .is_none(),
        "the key is free"
    );
    let again = layer
        .layer(slow)
        .oneshot(pay())
        .await
        .expect("a new call runs");
    assert_eq!(again.output, json!({"charge": 2}));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_stops_waiting_at_its_calls_deadline() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, _plan) = faulty(waiting());
    let slow = tool_watching_token(&runs, Duration::from_secs(5), unavailable_then_ok);
    let first = tokio::spawn(layer.layer(slow.clone()).oneshot(pay()));
    sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(1);
    let dup = layer
        .layer(slow.clone())
        .oneshot(pay().deadline(deadline))
        .await;
    assert_eq!(dup.expect_err("not run").kind(), ErrorKind::InProgress);
    assert!(
        started.elapsed() <= Duration::from_secs(1),
        "the wait ends by the deadline, not at wait_timeout ({:?})",
        started.elapsed()
    );
    first.await.expect("join").expect_err("503");
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        runs.started.load(Ordering::SeqCst),
        1,
        "the duplicate never ran past its deadline"
    );
    assert!(handle
        .record("pay", None, "order-7")
        .await
        .expect("get")
        .is_none_or(|r| r.status != RecordStatus::Failed));
}
