//! What a mutation dropped before it reached the tool leaves behind, with and without
//! the marks of the stack below (`IdempotencyLayer::with_attempt_marks`): with them, a
//! call that never reached the tool frees its key; without them, the layer cannot tell
//! and keeps it `OUTCOME_UNKNOWN`. A claim nested in another's call passes each mark on.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::sleep;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// A stack below the claim: waits `queue` (a bulkhead's queue, say), then marks the
/// attempt as it hands it to the tool, which counts its runs and takes `work`.
fn below(queue: Duration, work: Duration, runs: &Arc<AtomicU32>) -> Svc {
    let runs = Arc::clone(runs);
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let runs = Arc::clone(&runs);
        async move {
            sleep(queue).await;
            if let Some(state) = toolshield_core::ShieldRequest::call_state(&req) {
                state.mark_started();
            }
            runs.fetch_add(1, Ordering::SeqCst);
            sleep(work).await;
            Ok(ToolResponse::new(json!({ "charged": true })))
        }
    }))
}

fn layer(marks: bool) -> IdempotencyLayer {
    let layer = IdempotencyLayer::new(IdempotencyConfig::default()).expect("config");
    if marks {
        layer.with_attempt_marks()
    } else {
        layer
    }
}

fn order() -> ToolRequest {
    ToolRequest::new("pay", json!({ "amount": 5 }))
        .kind(CallKind::Mutating)
        .idempotency_key("order-1")
}

/// Drops a call after `after`, waits for the clean-up, and sends the order again.
async fn drop_then_again(svc: &Svc, after: Duration) -> Result<ToolResponse, ToolError> {
    let gave_up = tokio::time::timeout(after, svc.clone().oneshot(order())).await;
    assert!(gave_up.is_err(), "the call was still running: {gave_up:?}");
    sleep(Duration::from_secs(1)).await;
    svc.clone().oneshot(order()).await
}

#[tokio::test(start_paused = true)]
async fn with_marks_a_mutation_dropped_before_the_tool_frees_its_key() {
    let runs = Arc::new(AtomicU32::new(0));
    let svc = BoxCloneService::new(layer(true).layer(below(
        Duration::from_secs(5),
        Duration::ZERO,
        &runs,
    )));
    let res = drop_then_again(&svc, Duration::from_secs(1))
        .await
        .expect("the key was freed");
    assert!(!res.provenance.replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the second call ran");
}

#[tokio::test(start_paused = true)]
async fn without_marks_a_mutation_dropped_anywhere_stays_outcome_unknown() {
    let runs = Arc::new(AtomicU32::new(0));
    // The stack below marks, but the layer was not told it does: it cannot know that no
    // other way to the tool goes unmarked, and stays on the safe side.
    let svc = BoxCloneService::new(layer(false).layer(below(
        Duration::from_secs(5),
        Duration::ZERO,
        &runs,
    )));
    let e = drop_then_again(&svc, Duration::from_secs(1))
        .await
        .expect_err("kept");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn with_marks_a_mutation_dropped_after_the_tool_started_stays_outcome_unknown() {
    let runs = Arc::new(AtomicU32::new(0));
    let svc = BoxCloneService::new(layer(true).layer(below(
        Duration::ZERO,
        Duration::from_secs(5),
        &runs,
    )));
    let e = drop_then_again(&svc, Duration::from_secs(1))
        .await
        .expect_err("it may have charged");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never sent again");
}

#[tokio::test(start_paused = true)]
async fn a_timeout_before_the_tool_is_a_refusal_with_marks() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = Arc::clone(&runs);
    // A layer below gives up before the attempt is handed on (a queue's own limit).
    let refusing = BoxCloneService::new(service_fn(move |_req: ToolRequest| {
        let r = Arc::clone(&r);
        async move {
            if r.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(ToolError::timeout("gave up in the queue"));
            }
            Ok(ToolResponse::new(json!({ "charged": true })))
        }
    }));
    let svc: Svc = BoxCloneService::new(layer(true).layer(refusing));
    let e = svc.clone().oneshot(order()).await.expect_err("timed out");
    assert_eq!(
        e.kind(),
        ErrorKind::Timeout,
        "the caller gets the error as it was"
    );
    let res = svc.oneshot(order()).await.expect("the key was freed");
    assert!(!res.provenance.replayed);
}

#[tokio::test(start_paused = true)]
async fn a_claim_nested_in_another_calls_passes_its_marks_on() {
    let runs = Arc::new(AtomicU32::new(0));
    // A stack with a claim of its own (a shielded tool behind another shield): the mark
    // made below the inner claim reaches the outer one too. The second call goes
    // through another inner stack (its own store), so only the outer claim decides.
    let outer = layer(true);
    let nested = || {
        let inner = BoxCloneService::new(layer(true).layer(below(
            Duration::ZERO,
            Duration::from_secs(5),
            &runs,
        )));
        BoxCloneService::new(outer.layer(inner))
    };
    let (first, second): (Svc, Svc) = (nested(), nested());
    let gave_up = tokio::time::timeout(Duration::from_secs(1), first.oneshot(order())).await;
    assert!(gave_up.is_err(), "the call was still running: {gave_up:?}");
    sleep(Duration::from_secs(1)).await;
    let e = second
        .oneshot(order())
        .await
        .expect_err("the outer claim knows the work may have started");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never sent again");
}

#[tokio::test(start_paused = true)]
async fn a_mutation_whose_claim_lapses_before_the_tool_is_not_told_outcome_unknown() {
    use toolshield_core::faults::{Fault, FaultPlan};
    use toolshield_idempotency::testing::FaultyStore;
    use toolshield_idempotency::InMemoryIdempotencyStore;

    let runs = Arc::new(AtomicU32::new(0));
    // Every renewal fails: the call, still waiting below its claim, is abandoned a
    // quarter-lease before the lease ends.
    let plan = FaultPlan::new();
    plan.always("renew", Fault::Fail);
    let store = Arc::new(FaultyStore::new(
        Arc::new(InMemoryIdempotencyStore::new()),
        plan.clone(),
    ));
    let cfg = IdempotencyConfig {
        lease: Duration::from_secs(4),
        ..IdempotencyConfig::default()
    };
    let svc: Svc = BoxCloneService::new(
        IdempotencyLayer::with_store(cfg, store)
            .expect("config")
            .with_attempt_marks()
            .layer(below(Duration::from_secs(10), Duration::ZERO, &runs)),
    );
    let e = svc.clone().oneshot(order()).await.expect_err("abandoned");
    assert_eq!(e.kind(), ErrorKind::StoreUnavailable, "nothing ran: {e:?}");
    assert!(e.message().contains("was not started"), "{e:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The key was freed: once the store renews again, the order runs.
    plan.clear();
    let res = svc.oneshot(order()).await.expect("the key is free");
    assert!(!res.provenance.replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_reported_without_a_retry_beginning_undoes_nothing() {
    // A service below that marks its attempt, then reports a refusal although no retry
    // said where its attempts began, and goes on running: the mark stays.
    let svc: Svc =
        BoxCloneService::new(layer(true).layer(service_fn(|req: ToolRequest| async move {
            if let Some(state) = toolshield_core::ShieldRequest::call_state(&req) {
                state.mark_started();
                state.attempt_refused();
            }
            sleep(Duration::from_secs(5)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!({ "charged": true })))
        })));
    let e = drop_then_again(&svc, Duration::from_secs(1))
        .await
        .expect_err("it may have charged");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
}
