//! Behaviour of the idempotency layer, on a paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::{advance, sleep};
use toolshield_core::{CallKind, Digest, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{
    record_weight, storage_key, ClaimOutcome, IdempotencyConfig, IdempotencyHandle,
    IdempotencyLayer, IdempotencyRecord, IdempotencyStore, InMemoryIdempotencyStore, OnPending,
    OnStoreError, RecordStatus, StoreError, StoreFuture,
};
use toolshield_test::{counting_tool, BoxedTool};
use tower::{Layer, ServiceExt};

type Svc = BoxedTool;

fn ok_n(n: usize) -> Result<ToolResponse, ToolError> {
    Ok(ToolResponse::new(json!({ "charge": n })))
}

fn pay(amount: u64) -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": amount, "currency": "EUR"}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-7")
}

fn layer_with(
    cfg: IdempotencyConfig,
) -> (
    IdempotencyLayer,
    IdempotencyHandle,
    Arc<InMemoryIdempotencyStore>,
) {
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let layer = IdempotencyLayer::with_store(cfg, store.clone()).expect("valid config");
    let handle = layer.handle();
    (layer, handle, store)
}

fn layer() -> (
    IdempotencyLayer,
    IdempotencyHandle,
    Arc<InMemoryIdempotencyStore>,
) {
    layer_with(IdempotencyConfig::default())
}

async fn call(
    svc: &Svc,
    layer: &IdempotencyLayer,
    req: ToolRequest,
) -> Result<ToolResponse, ToolError> {
    layer.layer(svc.clone()).oneshot(req).await
}

fn charge(r: &ToolResponse) -> Value {
    r.output["charge"].clone()
}

#[tokio::test(start_paused = true)]
async fn sequential_duplicate_is_replayed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, handle, _) = layer();
    let first = call(&svc, &layer, pay(42)).await.expect("first");
    assert!(!first.provenance.replayed);
    advance(Duration::from_secs(5)).await;
    let again = call(&svc, &layer, pay(42)).await.expect("replay");
    assert!(again.provenance.replayed, "a duplicate is marked replayed");
    assert_eq!(again.output, first.output);
    assert!(first.provenance.fetched_at.is_some());
    assert_eq!(
        again.provenance.fetched_at, first.provenance.fetched_at,
        "original fetched_at"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let c = handle.counts();
    assert_eq!((c.executions, c.replays), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn concurrent_duplicates_wait_and_share_one_execution() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(2), ok_n);
    let (layer, handle, _) = layer();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..100 {
        set.spawn(layer.layer(svc.clone()).oneshot(pay(42)));
    }
    let mut results = Vec::new();
    while let Some(r) = set.join_next().await {
        results.push(r.expect("task").expect("every duplicate gets the result"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "exactly one execution");
    assert_eq!(results.len(), 100);
    assert!(
        results.iter().all(|r| r.output == json!({"charge": 1})),
        "100 identical results"
    );
    assert_eq!(results.iter().filter(|r| r.provenance.replayed).count(), 99);
    let c = handle.counts();
    assert_eq!((c.executions, c.waits, c.replays), (1, 99, 99));
}

#[tokio::test(start_paused = true)]
async fn concurrent_duplicates_fail_fast_with_in_progress() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(2), ok_n);
    let (layer, handle, _) = layer_with(IdempotencyConfig {
        on_pending: OnPending::FailFast,
        ..Default::default()
    });
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..100 {
        set.spawn(layer.layer(svc.clone()).oneshot(pay(42)));
    }
    let (mut ok, mut in_progress) = (0, 0);
    while let Some(r) = set.join_next().await {
        match r.expect("task") {
            Ok(r) => {
                assert_eq!(charge(&r), json!(1));
                ok += 1;
            }
            Err(e) if e.kind() == ErrorKind::InProgress => in_progress += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!((ok, in_progress), (1, 99));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(handle.counts().in_progress, 99);
}

#[tokio::test(start_paused = true)]
async fn waiting_is_bounded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(25), ok_n);
    let (layer, _, _) = layer();
    let first = tokio::spawn(layer.layer(svc.clone()).oneshot(pay(42)));
    sleep(Duration::from_millis(1)).await;
    let start = tokio::time::Instant::now();
    let e = call(&svc, &layer, pay(42))
        .await
        .expect_err("still running after the bound");
    assert_eq!(e.kind(), ErrorKind::InProgress);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(10),
        "waits the default 10 s, no longer"
    );
    first.await.expect("task").expect("first call completes");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn key_reused_with_another_payload_is_rejected_and_not_run() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, handle, _) = layer();
    call(&svc, &layer, pay(42)).await.expect("first");
    let e = call(&svc, &layer, pay(99))
        .await
        .expect_err("other payload");
    assert_eq!(e.kind(), ErrorKind::IdempotencyKeyReused);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "nothing ran");
    assert_eq!(handle.counts().conflicts, 1);
}

#[tokio::test(start_paused = true)]
async fn failed_is_replayed_within_its_ttl_then_allowed_again() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, |n| {
        if n == 1 {
            Err(ToolError::invalid_input("card declined"))
        } else {
            ok_n(n)
        }
    });
    let (layer, _, _) = layer();
    let e = call(&svc, &layer, pay(42)).await.expect_err("fails");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    advance(Duration::from_secs(59)).await;
    let replayed = call(&svc, &layer, pay(42))
        .await
        .expect_err("replayed failure");
    assert_eq!(replayed.kind(), ErrorKind::InvalidInput);
    assert_eq!(replayed.message(), "card declined");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the failure was replayed, not re-run"
    );
    advance(Duration::from_secs(2)).await;
    let ok = call(&svc, &layer, pay(42))
        .await
        .expect("allowed again after 60 s");
    assert_eq!(charge(&ok), json!(2));
}

#[tokio::test(start_paused = true)]
async fn retriable_failure_releases_the_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, |n| {
        if n == 1 {
            Err(ToolError::new(ErrorKind::ConnectionFailed, "refused"))
        } else {
            ok_n(n)
        }
    });
    let (layer, handle, _) = layer();
    let e = call(&svc, &layer, pay(42)).await.expect_err("retriable");
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
    assert!(
        handle
            .record("pay", None, "order-7")
            .await
            .expect("store")
            .is_none(),
        "the key is free"
    );
    let ok = call(&svc, &layer, pay(42))
        .await
        .expect("runs again at once");
    assert_eq!(charge(&ok), json!(2));
}

#[tokio::test(start_paused = true)]
async fn expired_lease_is_taken_over() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, _, store) = layer_with(IdempotencyConfig {
        on_pending: OnPending::FailFast,
        ..Default::default()
    });
    // An owner that claimed the key and died: nobody renews its 30 s lease.
    let digest = pay(42).payload_digest().expect("digest");
    let key = storage_key("pay", None, "order-7");
    let ghost = IdempotencyRecord::pending(digest, "ghost", Duration::from_secs(30));
    assert_eq!(
        store
            .claim(&key, ghost, Duration::from_secs(30))
            .await
            .expect("claim"),
        ClaimOutcome::Claimed
    );
    let e = call(&svc, &layer, pay(42))
        .await
        .expect_err("held by the ghost");
    assert_eq!(e.kind(), ErrorKind::InProgress);
    advance(Duration::from_secs(31)).await;
    let ok = call(&svc, &layer, pay(42))
        .await
        .expect("the expired lease is taken over");
    assert_eq!(charge(&ok), json!(1));
}

#[tokio::test(start_paused = true)]
async fn a_waiting_duplicate_takes_over_an_expired_lease() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, _, store) = layer_with(IdempotencyConfig {
        wait_timeout: Duration::from_secs(60),
        ..Default::default()
    });
    let digest = pay(42).payload_digest().expect("digest");
    let ghost = IdempotencyRecord::pending(digest, "ghost", Duration::from_secs(30));
    store
        .claim(
            &storage_key("pay", None, "order-7"),
            ghost,
            Duration::from_secs(30),
        )
        .await
        .expect("claim");
    let start = tokio::time::Instant::now();
    let ok = call(&svc, &layer, pay(42))
        .await
        .expect("taken over while waiting");
    assert_eq!(charge(&ok), json!(1));
    assert!(
        start.elapsed() >= Duration::from_secs(30) && start.elapsed() < Duration::from_secs(31)
    );
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_renewed_while_the_call_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(100), ok_n);
    let (layer, _, _) = layer_with(IdempotencyConfig {
        on_pending: OnPending::FailFast,
        ..Default::default()
    });
    let first = tokio::spawn(layer.layer(svc.clone()).oneshot(pay(42)));
    sleep(Duration::from_secs(80)).await;
    let e = call(&svc, &layer, pay(42))
        .await
        .expect_err("still held at 80 s, lease 30 s");
    assert_eq!(e.kind(), ErrorKind::InProgress);
    first.await.expect("task").expect("first");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn timeout_after_send_is_outcome_unknown_and_kept_until_forgotten() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, |n| {
        if n == 1 {
            Err(ToolError::timeout("attempt timed out after 30s"))
        } else {
            ok_n(n)
        }
    });
    let (layer, handle, _) = layer();
    let e = call(&svc, &layer, pay(42)).await.expect_err("timed out");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
    advance(Duration::from_secs(3600)).await;
    let again = call(&svc, &layer, pay(42)).await.expect_err("record kept");
    assert_eq!(again.kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never re-run blindly");
    let rec = handle
        .record("pay", None, "order-7")
        .await
        .expect("store")
        .expect("kept for reconciliation");
    assert_eq!(rec.status, RecordStatus::Failed);
    assert!(handle.forget("pay", None, "order-7").await.expect("store"));
    let ok = call(&svc, &layer, pay(42))
        .await
        .expect("runs after forget");
    assert_eq!(charge(&ok), json!(2));
    assert_eq!(handle.counts().outcome_unknown, 1);
}

#[tokio::test(start_paused = true)]
async fn timeout_of_an_idempotent_call_releases_the_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, |n| {
        if n == 1 {
            Err(ToolError::timeout("slow"))
        } else {
            ok_n(n)
        }
    });
    let (layer, _, _) = layer();
    let put = || pay(42).kind(CallKind::Idempotent);
    assert_eq!(
        call(&svc, &layer, put()).await.expect_err("timeout").kind(),
        ErrorKind::Timeout
    );
    assert_eq!(
        charge(&call(&svc, &layer, put()).await.expect("again")),
        json!(2)
    );
}

/// A store that is down.
struct DownStore;

impl IdempotencyStore for DownStore {
    fn claim<'a>(
        &'a self,
        _: &'a str,
        _: IdempotencyRecord,
        _: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async { Err(StoreError::new("connection refused")) })
    }
    fn finish<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: IdempotencyRecord,
        _: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async { Err(StoreError::new("connection refused")) })
    }
    fn renew<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async { Err(StoreError::new("connection refused")) })
    }
    fn release<'a>(&'a self, _: &'a str, _: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async { Err(StoreError::new("connection refused")) })
    }
    fn get<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Option<IdempotencyRecord>> {
        Box::pin(async { Err(StoreError::new("connection refused")) })
    }
    fn remove<'a>(&'a self, _: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async { Err(StoreError::new("connection refused")) })
    }
}

#[tokio::test(start_paused = true)]
async fn store_down_fails_closed_by_default() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), Arc::new(DownStore))
        .expect("valid");
    let e = call(&svc, &layer, pay(42)).await.expect_err("fail closed");
    assert_eq!(e.kind(), ErrorKind::StoreUnavailable);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing ran");
    assert_eq!(layer.handle().counts().store_errors, 1);
}

#[tokio::test(start_paused = true)]
async fn store_down_fails_open_when_configured() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let cfg = IdempotencyConfig {
        on_store_error: OnStoreError::FailOpen,
        ..Default::default()
    };
    let layer = IdempotencyLayer::with_store(cfg, Arc::new(DownStore)).expect("valid");
    let r = call(&svc, &layer, pay(42))
        .await
        .expect("runs without dedupe");
    assert_eq!(charge(&r), json!(1));
    let r = call(&svc, &layer, pay(42))
        .await
        .expect("runs again: no dedupe");
    assert_eq!(charge(&r), json!(2));
}

#[tokio::test(start_paused = true)]
async fn derived_keys_dedupe_by_tool_payload_caller_and_window() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, handle, _) = layer();
    let req = |caller: &str| {
        ToolRequest::new("pay", json!({"amount": 5}))
            .kind(CallKind::Mutating)
            .caller(caller.to_owned())
    };
    let a = req("alice");
    call(&svc, &layer, a.clone()).await.expect("first");
    let dup = call(&svc, &layer, req("alice"))
        .await
        .expect("derived key replays");
    assert!(dup.provenance.replayed);
    let bob = call(&svc, &layer, req("bob")).await.expect("other caller");
    assert!(
        !bob.provenance.replayed,
        "another caller derives another key"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let key = handle.key_for(&a).expect("key").expect("derived");
    let hex = key.rsplit(":d:").next().expect("a derived key");
    assert_eq!(hex.len(), 64, "hex sha256: {key}");
    assert!(key.starts_with("idemp:{pay}:s5:alice:d:"), "{key}");
}

#[tokio::test(start_paused = true)]
async fn read_only_calls_pass_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, handle, _) = layer();
    for _ in 0..2 {
        let r = call(&svc, &layer, pay(42).kind(CallKind::ReadOnly))
            .await
            .expect("ok");
        assert!(!r.provenance.replayed);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(handle.counts().executions, 0);
}

#[tokio::test(start_paused = true)]
async fn given_keys_are_scoped_by_caller() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, _, _) = layer();
    call(&svc, &layer, pay(42).caller("alice"))
        .await
        .expect("alice");
    let bob = call(&svc, &layer, pay(42).caller("bob"))
        .await
        .expect("bob");
    assert!(!bob.provenance.replayed, "bob never sees alice's record");
}

#[tokio::test(start_paused = true)]
async fn the_handle_finds_a_record_by_tool_caller_and_key_and_no_other_callers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, handle, _) = layer();
    call(&svc, &layer, pay(42).caller("alice"))
        .await
        .expect("alice");
    // The natural call: the key the caller sent, and who sent it.
    let rec = handle
        .record("pay", Some("alice"), "order-7")
        .await
        .expect("store")
        .expect("alice's record");
    assert_eq!(rec.status, RecordStatus::Completed);
    // Keys chosen to look like Alice's reach nothing: another caller, no caller, or a
    // key carrying her name.
    for (caller, key) in [
        (Some("bob"), "order-7"),
        (None, "order-7"),
        (None, "alice/order-7"),
        (Some("alice/order-7"), ""),
        (Some("ali"), "ce:g:order-7"),
    ] {
        let found = handle.record("pay", caller, key).await.expect("store");
        assert!(found.is_none(), "{caller:?} {key:?} reached alice's record");
        assert!(!handle.forget("pay", caller, key).await.expect("store"));
    }
    // Alice's record is still there, and forget clears exactly it.
    assert!(handle
        .forget("pay", Some("alice"), "order-7")
        .await
        .expect("store"));
    assert!(handle
        .record("pay", Some("alice"), "order-7")
        .await
        .expect("store")
        .is_none());
    let again = call(&svc, &layer, pay(42).caller("alice"))
        .await
        .expect("runs again");
    assert!(!again.provenance.replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_that_never_ran_frees_its_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(10), ok_n);
    let (layer, handle, _) = layer();
    let put = || pay(42).kind(CallKind::Idempotent);
    let task = tokio::spawn(layer.layer(svc.clone()).oneshot(put()));
    sleep(Duration::from_secs(1)).await;
    task.abort();
    let _ = task.await;
    sleep(Duration::from_millis(1)).await; // let the spawned release run
    assert!(
        handle
            .record("pay", None, "order-7")
            .await
            .expect("store")
            .is_none(),
        "an idempotent call's claim is released"
    );
    let r = call(&svc, &layer, put()).await.expect("runs at once");
    assert_eq!(charge(&r), json!(2));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_mutation_in_flight_is_outcome_unknown() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(10), ok_n);
    let (layer, _, _) = layer();
    let task = tokio::spawn(layer.layer(svc.clone()).oneshot(pay(42)));
    sleep(Duration::from_secs(1)).await;
    task.abort();
    let _ = task.await;
    sleep(Duration::from_millis(1)).await;
    let e = call(&svc, &layer, pay(42))
        .await
        .expect_err("may have been charged");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
    // The record is built when the call is dropped: it still says what happened.
    assert!(
        e.message().contains("was cancelled after it was sent"),
        "{e}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A tool that stops on its attempt token and answers `CANCELLED` may have been sent
/// the mutation first (an MCP call has, once handed to the transport): the key is kept
/// as `OUTCOME_UNKNOWN`, as when the call's future is dropped, and a repeat with it never
/// runs. The caller still gets its `CANCELLED`.
#[tokio::test(start_paused = true)]
async fn a_mutation_its_tool_ends_cancelled_keeps_its_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = BoxedTool::new(tower::service_fn(move |req: ToolRequest| {
        counter.fetch_add(1, Ordering::SeqCst);
        let token = req.attempt_token().clone();
        async move {
            token.cancelled().await;
            Err::<ToolResponse, _>(ToolError::cancelled("the tool stopped on its token"))
        }
    }));
    let (layer, _, _) = layer();
    let token = toolshield_core::CancellationToken::new();
    let task = tokio::spawn(
        layer
            .layer(svc.clone())
            .oneshot(pay(42).cancel_token(token.clone())),
    );
    sleep(Duration::from_secs(1)).await;
    token.cancel();
    let e = task.await.expect("task").expect_err("cancelled");
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    let again = tokio::time::timeout(Duration::from_secs(60), call(&svc, &layer, pay(42)))
        .await
        .expect("answered from the record, not run again")
        .expect_err("may have been charged");
    assert_eq!(again.kind(), ErrorKind::OutcomeUnknown, "{again}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn config_is_validated_and_strict() {
    assert!(serde_json::from_str::<IdempotencyConfig>(r#"{"lease_ttl": "1s"}"#).is_err());
    let cfg = IdempotencyConfig {
        lease: Duration::ZERO,
        failed_ttl: Duration::ZERO,
        poll_interval: Duration::from_secs(20),
        ..Default::default()
    };
    let err = cfg.validate().expect_err("invalid");
    assert_eq!(err.problems().len(), 3, "{err}");
    assert!(IdempotencyLayer::new(cfg).is_err());
    let _ = Digest::of_bytes(b"");
}

/// The in-memory store, counting the claims a waiting duplicate makes.
struct CountingStore {
    inner: InMemoryIdempotencyStore,
    claims: AtomicUsize,
}

impl IdempotencyStore for CountingStore {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        record: IdempotencyRecord,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(key, record, lease)
    }
    fn finish<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        self.inner.finish(key, owner, record, ttl)
    }
    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        self.inner.renew(key, owner, lease)
    }
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
        self.inner.release(key, owner)
    }
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<IdempotencyRecord>> {
        self.inner.get(key)
    }
    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        self.inner.remove(key)
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiting_duplicate_polls_with_a_growing_interval() {
    let store = Arc::new(CountingStore {
        inner: InMemoryIdempotencyStore::new(),
        claims: AtomicUsize::new(0),
    });
    let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), store.clone())
        .expect("valid config");
    let calls = Arc::new(AtomicUsize::new(0));
    // The first call runs for 5 s; the duplicate waits for it.
    let svc = counting_tool(&calls, Duration::from_secs(5), ok_n);
    let (first, second) = tokio::join!(call(&svc, &layer, pay(10)), async {
        sleep(Duration::from_millis(1)).await;
        call(&svc, &layer, pay(10)).await
    });
    assert_eq!(
        charge(&first.expect("first")),
        charge(&second.expect("second"))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Polling every 50 ms would claim ~100 times in 5 s; doubling from 50 ms up to 800 ms
    // claims about a dozen times (1 + 50, 100, 200, 400 ms, then every 800 ms).
    let claims = store.claims.load(Ordering::SeqCst);
    assert!((5..=15).contains(&claims), "{claims} claims");
}

/// A replay compares the payload kept with the in-memory record first and the canonical
/// digest only when the values differ: payloads equal as JSON in another key order
/// replay, a number written `42.0` for `42` is the same canonical payload and replays
/// too, a different amount is `IDEMPOTENCY_KEY_REUSED`; nothing runs twice.
#[tokio::test(start_paused = true)]
async fn replays_compare_the_kept_payload_then_the_digest() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, handle, store) = layer();
    let with = |payload: Value| {
        ToolRequest::new("pay", payload)
            .kind(CallKind::Mutating)
            .idempotency_key("order-9")
    };
    call(&svc, &layer, with(json!({"amount": 42, "currency": "EUR"})))
        .await
        .expect("first");
    // The finished record keeps the payload, and it counts in the store's weight.
    let key = handle
        .key_for(&with(json!({})))
        .expect("key")
        .expect("a key is set");
    let kept = store
        .get(&key)
        .await
        .expect("store")
        .expect("the record is there");
    assert_eq!(
        kept.payload.as_ref().map(|p| p.value().clone()),
        Some(json!({"amount": 42, "currency": "EUR"}))
    );
    let payload_len = r#"{"amount":42,"currency":"EUR"}"#.len();
    assert_eq!(
        store.entries().weighted_size(),
        u64::try_from(key.len() + record_weight(&kept) + payload_len).expect("fits"),
        "the kept payload weighs its compact JSON length"
    );
    let reordered = call(&svc, &layer, with(json!({"currency": "EUR", "amount": 42})))
        .await
        .expect("equal value");
    assert!(reordered.provenance.replayed);
    let float = call(
        &svc,
        &layer,
        with(json!({"amount": 42.0, "currency": "EUR"})),
    )
    .await
    .expect("same canonical payload");
    assert!(float.provenance.replayed);
    let other = call(&svc, &layer, with(json!({"amount": 43, "currency": "EUR"})))
        .await
        .expect_err("another payload");
    assert_eq!(other.kind(), ErrorKind::IdempotencyKeyReused);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "nothing ran twice");
    let c = handle.counts();
    assert_eq!((c.replays, c.conflicts), (2, 1));
}
