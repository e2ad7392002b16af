//! Exactly-once under store faults, clones and hostile keys, on a paused clock.
//!
//! Each test names the guarantee it protects; the store is wrapped in `FaultyStore` so
//! any operation can fail, land late, or succeed after the caller gave up on it.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{advance, sleep};
use toolshield_core::faults::Fault;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer, OnPending, RecordStatus};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

use support::{faulty, ok_n, tool, Runs};

fn pay(kind: CallKind) -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": 42}))
        .kind(kind)
        .idempotency_key("order-7")
}

fn lease_cfg() -> IdempotencyConfig {
    IdempotencyConfig {
        lease: Duration::from_secs(30),
        on_pending: OnPending::FailFast,
        ..IdempotencyConfig::default()
    }
}

// ----- 1. the fencing token is unique to each claim, not shared by clones -----

#[tokio::test(start_paused = true)]
async fn a_stale_clone_cannot_complete_over_the_claim_that_took_it_over() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, plan) = faulty(lease_cfg());
    let slow = tool(&runs, Duration::from_secs(60), ok_n);
    let req = pay(CallKind::Idempotent);
    // A claims; its renewals fail and its lease expires while it runs.
    plan.always("renew", Fault::Fail);
    let a = tokio::spawn(layer.layer(slow.clone()).oneshot(req.clone()));
    sleep(Duration::from_secs(31)).await;
    plan.clear();
    // B, a clone of the same request, takes the key over.
    let b = tokio::spawn(layer.layer(slow.clone()).oneshot(req.clone()));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(handle.counts().takeovers, 1, "the takeover is counted");
    // A finishes first: its record must not be accepted over B's live claim.
    let a = a.await.expect("join").expect("A's own call succeeded");
    assert!(
        a.provenance.unrecorded,
        "A is told its result is not recorded"
    );
    let rec = handle
        .record_for(&req)
        .await
        .expect("store")
        .expect("record");
    assert_eq!(rec.status, RecordStatus::Pending, "B still holds the key");
    let b = b.await.expect("join").expect("B");
    let rec = handle
        .record_for(&req)
        .await
        .expect("store")
        .expect("record");
    assert_eq!(rec.status, RecordStatus::Completed);
    assert_eq!(
        rec.result.expect("result").output,
        b.output,
        "B's result is recorded"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stale_clone_that_fails_cannot_release_the_claim_that_took_it_over() {
    let runs = Arc::new(Runs::default());
    let (layer, _handle, plan) = faulty(lease_cfg());
    let req = pay(CallKind::Idempotent);
    // A fails retriably after 40 s, B succeeds after 60 s.
    let failing = tool(&runs, Duration::from_secs(40), |_| {
        Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
    });
    let slow = tool(&runs, Duration::from_secs(60), ok_n);
    plan.always("renew", Fault::Fail);
    let a = tokio::spawn(layer.layer(failing).oneshot(req.clone()));
    sleep(Duration::from_secs(31)).await;
    plan.clear();
    let b = tokio::spawn(layer.layer(slow.clone()).oneshot(req.clone()));
    let a = a.await.expect("join");
    assert_eq!(
        a.expect_err("A failed").kind(),
        ErrorKind::UpstreamUnavailable
    );
    // A's release must not have freed B's key: C is told the call is in progress.
    let c = layer.layer(slow.clone()).oneshot(req.clone()).await;
    assert_eq!(c.expect_err("C must not run").kind(), ErrorKind::InProgress);
    b.await.expect("join").expect("B");
    assert_eq!(
        runs.started.load(Ordering::SeqCst),
        2,
        "A and B ran, C did not"
    );
}

#[tokio::test(start_paused = true)]
async fn a_mutation_that_cannot_renew_its_lease_gives_up_before_anyone_can_take_over() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, plan) = faulty(lease_cfg());
    let slow = tool(&runs, Duration::from_secs(60), ok_n);
    let req = pay(CallKind::Mutating);
    plan.always("renew", Fault::Fail);
    plan.always("fail", Fault::Fail); // not even OUTCOME_UNKNOWN can be written
    let a = tokio::spawn(layer.layer(slow.clone()).oneshot(req.clone()));
    sleep(Duration::from_secs(29)).await;
    assert_eq!(
        runs.running.load(Ordering::SeqCst),
        0,
        "A was dropped before its lease ended"
    );
    let a = a.await.expect("join");
    assert_eq!(a.expect_err("abandoned").kind(), ErrorKind::OutcomeUnknown);
    // The store takes nothing until the lease has expired.
    sleep(Duration::from_secs(2)).await;
    plan.clear();
    // B takes over, and never runs beside A.
    layer
        .layer(slow.clone())
        .oneshot(req.clone())
        .await
        .expect("B");
    assert_eq!(handle.counts().takeovers, 1);
    assert_eq!(
        runs.max_running.load(Ordering::SeqCst),
        1,
        "never two at once"
    );
}

// ----- 2. a result that cannot be recorded never frees the key silently -----

#[tokio::test(start_paused = true)]
async fn a_result_that_cannot_be_recorded_leaves_outcome_unknown_not_a_free_key() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, plan) = faulty(IdempotencyConfig::default());
    let quick = tool(&runs, Duration::from_millis(10), ok_n);
    plan.always("complete", Fault::Fail);
    let first = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await
        .expect("the tool's result is returned");
    assert!(first.provenance.unrecorded, "the caller is told");
    assert_eq!(handle.counts().unrecorded, 1);
    // Long after the lease, the duplicate is told the outcome is unknown; it never runs.
    advance(Duration::from_secs(120)).await;
    let dup = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await;
    assert_eq!(
        dup.expect_err("not run again").kind(),
        ErrorKind::OutcomeUnknown
    );
    assert_eq!(runs.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_to_record_is_retried_while_the_lease_is_kept() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, plan) = faulty(IdempotencyConfig::default());
    let quick = tool(&runs, Duration::from_millis(10), ok_n);
    plan.once("complete", Fault::Fail)
        .once("complete", Fault::ApplyThenFail);
    let first = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await
        .expect("ok");
    assert!(!first.provenance.unrecorded);
    let dup = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await
        .expect("replayed");
    assert!(dup.provenance.replayed);
    assert_eq!(dup.output, first.output);
    assert_eq!(runs.started.load(Ordering::SeqCst), 1);
    assert_eq!(handle.counts().unrecorded, 0);
}

// ----- 3. a claim that failed on the store but landed later is released -----

#[tokio::test(start_paused = true)]
async fn a_claim_that_lands_after_it_failed_does_not_block_the_key() {
    let runs = Arc::new(Runs::default());
    let (layer, _, plan) = faulty(lease_cfg());
    let quick = tool(&runs, Duration::from_millis(10), ok_n);
    plan.once("claim", Fault::ApplyLater(Duration::from_secs(2)));
    let first = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await;
    assert_eq!(
        first.expect_err("store down").kind(),
        ErrorKind::StoreUnavailable
    );
    assert_eq!(runs.started.load(Ordering::SeqCst), 0, "nothing ran");
    // The server resumes and applies the claim; the release sent after it frees the key.
    sleep(Duration::from_secs(3)).await;
    let retry = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await;
    assert!(retry.is_ok(), "a retry runs, not IN_PROGRESS: {retry:?}");
    assert_eq!(runs.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_claim_applied_before_its_reply_was_lost_does_not_block_the_key() {
    let runs = Arc::new(Runs::default());
    let (layer, _, plan) = faulty(lease_cfg());
    let quick = tool(&runs, Duration::from_millis(10), ok_n);
    plan.once("claim", Fault::ApplyThenFail);
    let first = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await;
    assert_eq!(
        first.expect_err("store").kind(),
        ErrorKind::StoreUnavailable
    );
    sleep(Duration::from_millis(100)).await;
    layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await
        .expect("the retry runs");
}

// ----- 5. isolation: keys of different callers never meet -----

#[tokio::test(start_paused = true)]
async fn a_caller_less_key_never_replays_a_callers_record() {
    let runs = Arc::new(Runs::default());
    let (layer, _, _) = faulty(IdempotencyConfig::default());
    let svc = tool(&runs, Duration::ZERO, ok_n);
    let alice = ToolRequest::new("pay", json!({"amount": 42}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-1")
        .caller("alice");
    layer
        .layer(svc.clone())
        .oneshot(alice)
        .await
        .expect("alice");
    let anon = ToolRequest::new("pay", json!({"amount": 42}))
        .kind(CallKind::Mutating)
        .idempotency_key("alice/order-1");
    let r = layer.layer(svc.clone()).oneshot(anon).await.expect("anon");
    assert!(
        !r.provenance.replayed,
        "Alice's record was replayed to a stranger"
    );
    // And a stranger cannot block Alice's key with another payload.
    let squat = ToolRequest::new("pay", json!({"amount": 1}))
        .kind(CallKind::Mutating)
        .idempotency_key("alice/order-2");
    layer
        .layer(svc.clone())
        .oneshot(squat)
        .await
        .expect("squat");
    let alice2 = ToolRequest::new("pay", json!({"amount": 42}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-2")
        .caller("alice");
    layer
        .layer(svc.clone())
        .oneshot(alice2)
        .await
        .expect("alice's own key is hers");
}

#[tokio::test(start_paused = true)]
async fn callers_and_keys_with_separators_never_share_a_record() {
    let runs = Arc::new(Runs::default());
    let (layer, _, _) = faulty(IdempotencyConfig::default());
    let svc = tool(&runs, Duration::ZERO, ok_n);
    let req = |caller: &str, key: &str| {
        ToolRequest::new("pay", json!({"amount": 9}))
            .kind(CallKind::Mutating)
            .idempotency_key(key.to_owned())
            .caller(caller.to_owned())
    };
    layer
        .layer(svc.clone())
        .oneshot(req("acme", "bot/order-9"))
        .await
        .expect("acme");
    let other = layer
        .layer(svc.clone())
        .oneshot(req("acme/bot", "order-9"))
        .await
        .expect("acme/bot");
    assert!(!other.provenance.replayed);
    assert_eq!(runs.started.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_blank_key_is_no_key() {
    let runs = Arc::new(Runs::default());
    let cfg = IdempotencyConfig {
        derive_keys: false,
        ..IdempotencyConfig::default()
    };
    let (layer, handle, _) = faulty(cfg);
    let svc = tool(&runs, Duration::ZERO, ok_n);
    for amount in [1, 2] {
        let req = ToolRequest::new("pay", json!({ "amount": amount }))
            .kind(CallKind::Mutating)
            .idempotency_key("  ");
        let r = layer.layer(svc.clone()).oneshot(req).await;
        assert!(r.is_ok(), "two keyless calls are not one record: {r:?}");
    }
    assert_eq!(handle.counts().executions, 0, "not deduped at all");
}

/// Whitespace around a key is not part of it: HTTP strips it from a header value, so a
/// server sees `" order-7 "` as `order-7`, and two records for what the server takes as
/// one key would let the mutation run twice here while the server replays it.
#[tokio::test(start_paused = true)]
async fn whitespace_around_a_key_is_not_part_of_it() {
    let runs = Arc::new(Runs::default());
    let (layer, _, _) = faulty(IdempotencyConfig::default());
    let svc = tool(&runs, Duration::ZERO, ok_n);
    let mut outputs = Vec::new();
    for key in ["order-7", " order-7 ", "\torder-7"] {
        let req = ToolRequest::new("pay", json!({ "amount": 5 }))
            .kind(CallKind::Mutating)
            .idempotency_key(key);
        let r = layer.layer(svc.clone()).oneshot(req).await.expect("call");
        outputs.push(r.output.clone());
    }
    assert_eq!(
        runs.started.load(Ordering::SeqCst),
        1,
        "one key, one execution"
    );
    assert!(outputs.windows(2).all(|w| w[0] == w[1]), "{outputs:?}");
}

#[tokio::test(start_paused = true)]
async fn the_handle_reads_and_forgets_a_key_given_with_whitespace_around_it() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, _) = faulty(IdempotencyConfig::default());
    let timing_out = tool(&runs, Duration::ZERO, |_| {
        Err(ToolError::new(
            ErrorKind::Timeout,
            "no answer after the charge",
        ))
    });
    let req = ToolRequest::new("pay", json!({ "amount": 5 }))
        .kind(CallKind::Mutating)
        .idempotency_key(" order-7\t");
    let r = layer.layer(timing_out.clone()).oneshot(req.clone()).await;
    assert_eq!(r.expect_err("unknown").kind(), ErrorKind::OutcomeUnknown);
    // An operator reconciles with the key as the caller sent it.
    let rec = handle.record("pay", None, " order-7\t").await.expect("get");
    assert_eq!(rec.map(|r| r.status), Some(RecordStatus::Failed));
    assert!(handle
        .forget("pay", None, " order-7\t")
        .await
        .expect("forget"));
    assert!(handle
        .record("pay", None, "order-7")
        .await
        .expect("get")
        .is_none());
}

// ----- 7. a failure inside the tool layer leaves a mutation OUTCOME_UNKNOWN -----

#[tokio::test(start_paused = true)]
async fn a_mutation_that_fails_inside_the_tool_layer_ends_outcome_unknown() {
    let runs = Arc::new(Runs::default());
    let (layer, _, _) = faulty(IdempotencyConfig::default());
    let internal = tool(&runs, Duration::ZERO, |_| {
        Err(ToolError::internal("the tool panicked"))
    });
    let r = layer
        .layer(internal.clone())
        .oneshot(pay(CallKind::Mutating))
        .await;
    assert_eq!(r.expect_err("unknown").kind(), ErrorKind::OutcomeUnknown);
    let dup = layer.layer(internal).oneshot(pay(CallKind::Mutating)).await;
    assert_eq!(dup.expect_err("replayed").kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(runs.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_mutation_whose_tool_panics_ends_outcome_unknown() {
    let (layer, _, _) = faulty(IdempotencyConfig::default());
    let panicking = BoxCloneService::new(service_fn(|req: ToolRequest| async move {
        let amount = req.payload()["missing"].as_u64();
        // A tool bug: an unwrap on a missing argument.
        let _ = amount.expect("missing argument");
        Ok::<_, ToolError>(ToolResponse::new(json!({})))
    }));
    let joined = tokio::spawn(
        layer
            .layer(panicking.clone())
            .oneshot(pay(CallKind::Mutating)),
    )
    .await;
    assert!(
        joined.is_err(),
        "without a catch-panic layer the task panics"
    );
    sleep(Duration::from_millis(10)).await; // the guard's cleanup runs
    let dup = layer
        .layer(panicking)
        .oneshot(pay(CallKind::Mutating))
        .await;
    assert_eq!(
        dup.expect_err("not run again").kind(),
        ErrorKind::OutcomeUnknown
    );
}

// ----- 4. durations are bounded -----

#[test]
fn durations_beyond_the_bound_are_rejected_with_every_other_problem() {
    let cfg: IdempotencyConfig = serde_json::from_str(
        r#"{"wait_timeout": "300000000000years", "record_ttl": "1000years", "lease": "1ms"}"#,
    )
    .expect("parses");
    let err = cfg.validate().expect_err("rejected");
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert!(fields.contains(&"wait_timeout"), "{err}");
    assert!(fields.contains(&"record_ttl"), "{err}");
    assert!(fields.contains(&"lease"), "{err}");
    assert!(IdempotencyLayer::new(cfg).is_err());
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_mutation_is_recorded_outcome_unknown_once_the_store_is_back() {
    let runs = Arc::new(Runs::default());
    let (layer, _handle, plan) = faulty(lease_cfg());
    let slow = tool(&runs, Duration::from_secs(60), ok_n);
    let req = pay(CallKind::Mutating);
    plan.always("renew", Fault::Fail);
    plan.always("fail", Fault::Fail);
    let a = layer.layer(slow.clone()).oneshot(req.clone()).await;
    assert_eq!(a.expect_err("abandoned").kind(), ErrorKind::OutcomeUnknown);
    // The store comes back while the claim still lives: the record is written in the
    // background, so a duplicate is told the outcome is unknown instead of running.
    plan.clear();
    sleep(Duration::from_secs(10)).await;
    let b = layer.layer(slow.clone()).oneshot(req.clone()).await;
    assert_eq!(b.expect_err("not run").kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(runs.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_oversized_key_is_invalid_input_and_nothing_runs() {
    let runs = Arc::new(Runs::default());
    let (layer, _, _) = faulty(IdempotencyConfig::default());
    let svc = tool(&runs, Duration::ZERO, ok_n);
    let req = ToolRequest::new("pay", json!({"amount": 1}))
        .kind(CallKind::Mutating)
        .idempotency_key("k".repeat(toolshield_idempotency::MAX_KEY_LEN + 1));
    let r = layer.layer(svc.clone()).oneshot(req).await;
    assert_eq!(r.expect_err("rejected").kind(), ErrorKind::InvalidInput);
    assert_eq!(runs.started.load(Ordering::SeqCst), 0);
    let ok = ToolRequest::new("pay", json!({"amount": 1}))
        .kind(CallKind::Mutating)
        .idempotency_key("k".repeat(toolshield_idempotency::MAX_KEY_LEN));
    layer
        .layer(svc)
        .oneshot(ok)
        .await
        .expect("a key of the limit is fine");
}

// ----- a key keeps its payload while its lapsed claim is known -----

/// The owner of a key dies mid-call (its future is forgotten: no cleanup, no renewal) and
/// its lease lapses: the same key with another payload is `IDEMPOTENCY_KEY_REUSED` and
/// nothing runs (the dead owner's mutation may have taken effect); the first payload
/// takes the claim over.
#[tokio::test(start_paused = true)]
async fn a_key_whose_owner_died_is_refused_to_another_payload() {
    let runs = Arc::new(Runs::default());
    let (layer, _handle, _plan) = faulty(lease_cfg());
    let svc = tool(&runs, Duration::from_secs(3600), ok_n);
    let mut first = Box::pin(layer.layer(svc.clone()).oneshot(pay(CallKind::Mutating)));
    tokio::select! {
        biased;
        _ = &mut first => panic!("the first call runs for an hour"),
        () = sleep(Duration::from_millis(10)) => {}
    }
    assert_eq!(runs.started.load(Ordering::SeqCst), 1);
    #[allow(clippy::mem_forget)]
    std::mem::forget(first); // the process dies
    advance(Duration::from_secs(45)).await; // past the lease, within the takeover window

    let other = ToolRequest::new("pay", json!({"amount": 99}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-7");
    let err = layer
        .layer(svc.clone())
        .oneshot(other)
        .await
        .expect_err("another payload under a used key");
    assert_eq!(err.kind(), ErrorKind::IdempotencyKeyReused);
    assert_eq!(runs.started.load(Ordering::SeqCst), 1, "nothing ran for 99");

    let quick = tool(&runs, Duration::ZERO, ok_n);
    layer
        .layer(quick)
        .oneshot(pay(CallKind::Mutating))
        .await
        .expect("the first payload takes the lapsed claim over");
    assert_eq!(runs.started.load(Ordering::SeqCst), 2);
}

// ----- a claim answered too late to keep its lease does not start a mutation -----

#[tokio::test(start_paused = true)]
async fn a_claim_answered_late_renews_before_the_mutation_starts() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, plan) = faulty(IdempotencyConfig {
        lease: Duration::from_secs(4),
        ..lease_cfg()
    });
    let quick = tool(&runs, Duration::from_millis(100), ok_n);
    // The claim's answer takes most of the lease, and so does the renewal after it: the
    // call would be past its abandon point (a quarter-lease before the lease ends) as
    // soon as it started.
    plan.once("claim", Fault::Delay(Duration::from_millis(3_500)));
    plan.once("renew", Fault::Delay(Duration::from_secs(1)));
    let resp = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await
        .expect("the claim is renewed first, then the call runs and is recorded");
    assert_eq!(resp.output, json!({"charge": 1}));
    assert_eq!(runs.started.load(Ordering::SeqCst), 1);
    let rec = handle.record("pay", None, "order-7").await.expect("get");
    assert_eq!(rec.map(|r| r.status), Some(RecordStatus::Completed));
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_cannot_be_kept_never_starts_the_mutation() {
    let runs = Arc::new(Runs::default());
    let (layer, handle, plan) = faulty(IdempotencyConfig {
        lease: Duration::from_secs(4),
        ..lease_cfg()
    });
    let quick = tool(&runs, Duration::from_millis(100), ok_n);
    plan.once("claim", Fault::Delay(Duration::from_millis(3_500)));
    plan.always("renew", Fault::Fail);
    let err = layer
        .layer(quick.clone())
        .oneshot(pay(CallKind::Mutating))
        .await
        .expect_err("the claim cannot be kept");
    assert_eq!(err.kind(), ErrorKind::StoreUnavailable);
    assert_eq!(
        runs.started.load(Ordering::SeqCst),
        0,
        "the tool was never called"
    );
    // Nothing ran, so the key is free again (not OUTCOME_UNKNOWN for a day).
    plan.clear();
    sleep(Duration::from_millis(10)).await;
    assert!(handle
        .record("pay", None, "order-7")
        .await
        .expect("get")
        .is_none());
    layer
        .layer(quick)
        .oneshot(pay(CallKind::Mutating))
        .await
        .expect("a new call runs");
    assert_eq!(runs.started.load(Ordering::SeqCst), 1);
}
