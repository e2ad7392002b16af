//! The IETF `Idempotency-Key` draft's cases and Stripe's, against the layer, on a paused
//! clock: each answer's kind, the replayed response, caller scoping, hostile keys and
//! extreme durations.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, Instant};
use toolshield_core::faults::FaultPlan;
use toolshield_core::{CallKind, Digest, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::testing::FaultyStore;
use toolshield_idempotency::{
    IdempotencyConfig, IdempotencyLayer, IdempotencyRecord, IdempotencyStore,
    InMemoryIdempotencyStore, OnPending, PendingClaim, MAX_KEY_LEN,
};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

fn tool(runs: &Arc<AtomicUsize>, delay: Duration) -> Svc {
    let runs = Arc::clone(runs);
    BoxCloneService::new(service_fn(move |_req: ToolRequest| {
        let runs = Arc::clone(&runs);
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            sleep(delay).await;
            let mut r = ToolResponse::new(json!({ "charge": n }));
            r.provenance.attempts = 3;
            r.provenance.response_digest = Some(Digest::of_bytes(b"x"));
            Ok(r)
        }
    }))
}

fn pay(amount: u64, key: &str) -> ToolRequest {
    ToolRequest::new("pay", json!({ "amount": amount }))
        .kind(CallKind::Mutating)
        .idempotency_key(key.to_owned())
}

fn memory_layer(cfg: IdempotencyConfig) -> IdempotencyLayer {
    IdempotencyLayer::new(cfg).expect("config")
}

/// A store with no `finished_now`: every replay goes through a claim.
fn claim_path_layer(cfg: IdempotencyConfig) -> IdempotencyLayer {
    let store = FaultyStore::new(Arc::new(InMemoryIdempotencyStore::new()), FaultPlan::new());
    IdempotencyLayer::with_store(cfg, Arc::new(store)).expect("config")
}

#[tokio::test(start_paused = true)]
async fn a_replay_is_the_stored_response_marked_replayed_on_both_paths() {
    for layer in [
        memory_layer(Default::default()),
        claim_path_layer(Default::default()),
    ] {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = tool(&runs, Duration::ZERO);
        let first = layer
            .layer(svc.clone())
            .oneshot(pay(1, "k"))
            .await
            .expect("first");
        let again = layer
            .layer(svc.clone())
            .oneshot(pay(1, "k"))
            .await
            .expect("again");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(again.provenance.replayed);
        assert!(!first.provenance.replayed);
        assert_eq!(again.output, first.output);
        assert_eq!(again.provenance.attempts, 3);
        assert_eq!(
            again.provenance.response_digest,
            first.provenance.response_digest
        );
        assert_eq!(again.provenance.execution_id, first.provenance.execution_id);
        assert_eq!(again.provenance.fetched_at, first.provenance.fetched_at);
    }
}

#[tokio::test(start_paused = true)]
async fn another_payload_while_the_first_runs_is_refused_at_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = memory_layer(Default::default());
    let svc = tool(&runs, Duration::from_secs(5));
    let first = tokio::spawn(layer.layer(svc.clone()).oneshot(pay(1, "k")));
    sleep(Duration::from_millis(1)).await;
    let t = Instant::now();
    let err = layer
        .layer(svc.clone())
        .oneshot(pay(2, "k"))
        .await
        .expect_err("422");
    assert_eq!(err.kind(), ErrorKind::IdempotencyKeyReused);
    assert_eq!(t.elapsed(), Duration::ZERO, "no wait for another payload");
    first.await.expect("join").expect("first");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn callers_absent_empty_and_named_never_share() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = memory_layer(Default::default());
    let svc = tool(&runs, Duration::ZERO);
    for caller in [None, Some(""), Some("a"), Some("b")] {
        let mut req = pay(1, "k");
        if let Some(c) = caller {
            req = req.caller(c.to_owned());
        }
        let r = layer.layer(svc.clone()).oneshot(req).await.expect("ran");
        assert!(!r.provenance.replayed, "{caller:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn hostile_keys_never_panic() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = memory_layer(Default::default());
    let svc = tool(&runs, Duration::ZERO);
    for key in [
        "\0",
        "a\nb",
        "\u{1b}[2J",
        "}",
        "{x}",
        " k ",
        &"é".repeat(127),
    ] {
        let r = layer.layer(svc.clone()).oneshot(pay(1, key)).await;
        assert!(r.is_ok(), "{key:?}: {r:?}");
        let r = layer
            .layer(svc.clone())
            .oneshot(pay(1, key))
            .await
            .expect("replay");
        assert!(r.provenance.replayed, "{key:?}");
    }
    let long = "é".repeat(128);
    assert!(long.len() > MAX_KEY_LEN);
    let e = layer
        .layer(svc.clone())
        .oneshot(pay(1, &long))
        .await
        .expect_err("too long");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let e = layer
        .layer(svc.clone())
        .oneshot(pay(1, &"x".repeat(1 << 20)))
        .await
        .expect_err("too long");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
}

#[tokio::test(start_paused = true)]
async fn extreme_durations_in_the_store_never_panic() {
    let store = InMemoryIdempotencyStore::new();
    let d = Digest::of_bytes(b"{}");
    for lease in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        let key = format!("k{lease:?}");
        let claim = PendingClaim {
            payload_hash: d,
            owner: "o",
        };
        let _ = store.claim_pending(&key, claim, lease).await;
        let _ = store.renew(&key, "o", lease).await;
        let _ = store.mark_resume(&key, "o", "t", lease).await;
        let rec = IdempotencyRecord::completed(d, "o", ToolResponse::new(json!(1)), lease);
        let _ = store.finish(&key, "o", rec, lease).await;
        let _ = store.get(&key).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_while_the_first_runs_is_in_progress_with_fail_fast() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = memory_layer(IdempotencyConfig {
        on_pending: OnPending::FailFast,
        ..Default::default()
    });
    let svc = tool(&runs, Duration::from_secs(5));
    let first = tokio::spawn(layer.layer(svc.clone()).oneshot(pay(1, "k")));
    sleep(Duration::from_millis(1)).await;
    let err = layer
        .layer(svc.clone())
        .oneshot(pay(1, "k"))
        .await
        .expect_err("409");
    assert_eq!(err.kind(), ErrorKind::InProgress);
    first.await.expect("join").expect("first");
}

/// The store operation that hangs, the tool's answer, the call kind, and the record
/// status expected once the dropped call's cleanup ran.
type DropCase = (
    &'static str,
    Result<ToolResponse, ToolError>,
    CallKind,
    Option<toolshield_idempotency::RecordStatus>,
);

fn answering(result: Result<ToolResponse, ToolError>) -> Svc {
    BoxCloneService::new(service_fn(move |_req: ToolRequest| {
        let r = result.clone();
        async move { r }
    }))
}

#[tokio::test(start_paused = true)]
async fn a_drop_at_each_store_await_leaves_the_documented_record() {
    use toolshield_core::faults::Fault;
    use toolshield_idempotency::RecordStatus;
    let cases: Vec<DropCase> = vec![
        (
            "claim",
            Ok(ToolResponse::new(json!(1))),
            CallKind::Mutating,
            None,
        ),
        (
            "complete",
            Ok(ToolResponse::new(json!(1))),
            CallKind::Mutating,
            Some(RecordStatus::Completed),
        ),
        (
            "fail",
            Err(ToolError::new(ErrorKind::ExecutionFailed, "x")),
            CallKind::Mutating,
            Some(RecordStatus::Failed),
        ),
        (
            "fail",
            Err(ToolError::new(ErrorKind::Timeout, "x")),
            CallKind::Mutating,
            Some(RecordStatus::Failed),
        ),
        (
            "release",
            Err(ToolError::new(ErrorKind::ConnectionFailed, "x")),
            CallKind::Mutating,
            None,
        ),
        (
            "complete",
            Ok(ToolResponse::new(json!(1))),
            CallKind::Idempotent,
            Some(RecordStatus::Completed),
        ),
    ];
    for (op, result, kind, want) in cases {
        let plan = FaultPlan::new();
        let store = FaultyStore::new(Arc::new(InMemoryIdempotencyStore::new()), plan.clone());
        let layer = IdempotencyLayer::with_store(Default::default(), Arc::new(store)).expect("cfg");
        let handle = layer.handle();
        plan.once(op, Fault::Hang);
        let req = pay(1, "k").kind(kind);
        let fut = layer.layer(answering(result.clone())).oneshot(req);
        let r = tokio::time::timeout(Duration::from_secs(1), fut).await;
        assert!(r.is_err(), "{op}: hangs");
        sleep(Duration::from_secs(1)).await;
        let rec = handle.record("pay", None, "k").await.expect("get");
        assert_eq!(
            rec.as_ref().map(|r| r.status),
            want,
            "{op} {result:?} {kind:?}: {rec:?}"
        );
    }
}
