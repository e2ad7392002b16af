//! A key's life as the IETF `Idempotency-Key` draft and the reliability spec describe it:
//! retention and expiry, which failures free a key and which are kept, fingerprints that
//! ignore key order and whitespace, and many duplicates at once, on a paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::{advance, sleep};
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::testing::FaultyStore;
use toolshield_idempotency::{
    IdempotencyConfig, IdempotencyLayer, InMemoryIdempotencyStore, OnPending,
};
use toolshield_test::{counting_tool, BoxedTool, Rng};
use tower::{Layer, ServiceExt};

/// A tool's answer to its n-th execution.
type Answer = fn(usize) -> Result<ToolResponse, ToolError>;

fn ok_n(n: usize) -> Result<ToolResponse, ToolError> {
    Ok(ToolResponse::new(json!({ "charge": n })))
}

fn pay_with(payload: Value, key: &str) -> ToolRequest {
    ToolRequest::new("pay", payload)
        .kind(CallKind::Mutating)
        .idempotency_key(key.to_owned())
}

fn pay(key: &str) -> ToolRequest {
    pay_with(json!({"amount": 42, "currency": "EUR"}), key)
}

/// The in-memory store as it is (replays answered in `call`), and behind a store that
/// answers only through claims (as a remote store does).
fn both_paths(cfg: IdempotencyConfig) -> [IdempotencyLayer; 2] {
    let wrapped = FaultyStore::new(Arc::new(InMemoryIdempotencyStore::new()), FaultPlan::new());
    [
        IdempotencyLayer::new(cfg.clone()).expect("config"),
        IdempotencyLayer::with_store(cfg, Arc::new(wrapped)).expect("config"),
    ]
}

async fn call(
    svc: &BoxedTool,
    layer: &IdempotencyLayer,
    req: ToolRequest,
) -> Result<ToolResponse, ToolError> {
    layer.layer(svc.clone()).oneshot(req).await
}

#[tokio::test(start_paused = true)]
async fn a_completed_key_is_replayed_until_its_retention_ends_then_runs_again() {
    let cfg = IdempotencyConfig {
        record_ttl: Duration::from_secs(600),
        ..Default::default()
    };
    for layer in both_paths(cfg) {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = counting_tool(&runs, Duration::ZERO, ok_n);
        let first = call(&svc, &layer, pay("k")).await.expect("first");
        assert!(!first.provenance.replayed);
        advance(Duration::from_secs(599)).await;
        let again = call(&svc, &layer, pay("k")).await.expect("replay");
        assert!(again.provenance.replayed);
        assert_eq!(again.output, first.output);
        advance(Duration::from_secs(2)).await;
        let later = call(&svc, &layer, pay("k")).await.expect("free again");
        assert!(!later.provenance.replayed);
        assert_eq!(later.output, json!({"charge": 2}));
        // Past retention the key is free for any payload.
        advance(Duration::from_secs(601)).await;
        let other = call(&svc, &layer, pay_with(json!({"amount": 7}), "k"))
            .await
            .expect("another payload once the key expired");
        assert_eq!(other.output, json!({"charge": 3}));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}

#[tokio::test(start_paused = true)]
async fn an_outcome_unknown_key_is_kept_for_its_retention_then_freed() {
    let cfg = IdempotencyConfig {
        record_ttl: Duration::from_secs(600),
        ..Default::default()
    };
    for layer in both_paths(cfg) {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = counting_tool(&runs, Duration::ZERO, |n| {
            if n == 1 {
                Err(ToolError::timeout("no answer"))
            } else {
                ok_n(n)
            }
        });
        let e = call(&svc, &layer, pay("k")).await.expect_err("timed out");
        assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
        advance(Duration::from_secs(599)).await;
        let e = call(&svc, &layer, pay("k")).await.expect_err("kept");
        assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        advance(Duration::from_secs(2)).await;
        call(&svc, &layer, pay("k")).await.expect("free again");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

/// What the next call with the key sees after the first call failed with `kind`.
#[derive(Debug, PartialEq)]
enum Next {
    /// The key was freed: the tool runs again.
    RunsAgain,
    /// The failure was stored: the same error, nothing runs.
    Replayed,
    /// The mutation may have happened: `OUTCOME_UNKNOWN`, nothing runs.
    Unknown,
}

fn documented(kind: ErrorKind, call_kind: CallKind) -> Next {
    let mutating = call_kind == CallKind::Mutating;
    match kind {
        // A definitive answer of the tool: kept for `failed_ttl`.
        ErrorKind::InvalidInput
        | ErrorKind::Unauthorized
        | ErrorKind::NotFound
        | ErrorKind::ExecutionFailed => Next::Replayed,
        // May have happened after it was sent.
        ErrorKind::Timeout
        | ErrorKind::OutcomeUnknown
        | ErrorKind::Internal
        | ErrorKind::Cancelled
            if mutating =>
        {
            Next::Unknown
        }
        // Transient, never sent, or a rejection by the stack: the tool gave no verdict.
        _ => Next::RunsAgain,
    }
}

#[tokio::test(start_paused = true)]
async fn each_failure_frees_the_key_or_is_kept_as_documented() {
    for call_kind in [CallKind::Mutating, CallKind::Idempotent] {
        for kind in ErrorKind::ALL {
            let layer = IdempotencyLayer::new(IdempotencyConfig::default()).expect("config");
            let runs = Arc::new(AtomicUsize::new(0));
            let svc = counting_tool(&runs, Duration::ZERO, move |n| {
                if n == 1 {
                    Err(ToolError::new(kind, "first attempt failed"))
                } else {
                    ok_n(n)
                }
            });
            let req = || pay("k").kind(call_kind);
            let first = call(&svc, &layer, req()).await.expect_err("fails");
            let expected = documented(kind, call_kind);
            let next = call(&svc, &layer, req()).await;
            let seen = match (&next, runs.load(Ordering::SeqCst)) {
                (Ok(r), 2) if !r.provenance.replayed => Next::RunsAgain,
                (Err(e), 1) if e.kind() == ErrorKind::OutcomeUnknown => Next::Unknown,
                (Err(e), 1) if e.kind() == kind && e.message() == first.message() => Next::Replayed,
                other => panic!("{call_kind:?} {kind:?}: unexpected {other:?}"),
            };
            assert_eq!(seen, expected, "{call_kind:?} after {kind:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn payloads_equal_as_json_share_one_fingerprint() {
    let texts = [
        (
            r#"{"amount":42,"currency":"EUR","meta":{"a":1,"b":[1,2]}}"#,
            "{ \"meta\" : { \"b\" : [ 1 , 2 ] , \"a\" : 1 } ,\n\t\"currency\":\"EUR\", \"amount\" : 42 }",
        ),
        (r#"{"n":1.0}"#, r#"{"n":1}"#),
        (r#"{"n":100}"#, r#"{"n":1e2}"#),
        (r#"{"s":"é"}"#, r#"{"s":"\u00e9"}"#),
    ];
    for layer in both_paths(IdempotencyConfig::default()) {
        for (i, (a, b)) in texts.iter().enumerate() {
            let a: Value = serde_json::from_str(a).expect("json");
            let b: Value = serde_json::from_str(b).expect("json");
            let runs = Arc::new(AtomicUsize::new(0));
            let svc = counting_tool(&runs, Duration::ZERO, ok_n);
            let key = format!("k{i}");
            let first = call(&svc, &layer, pay_with(a.clone(), &key))
                .await
                .expect("first");
            let again = call(&svc, &layer, pay_with(b.clone(), &key))
                .await
                .unwrap_or_else(|e| panic!("{a} then {b}: {e}"));
            assert!(again.provenance.replayed, "{a} then {b}");
            assert_eq!(again.output, first.output);
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            // Derived keys (no key given) dedupe the two as well.
            let derived = |p: &Value| ToolRequest::new("pay", p.clone()).kind(CallKind::Mutating);
            call(&svc, &layer, derived(&a)).await.expect("derived");
            let again = call(&svc, &layer, derived(&b)).await.expect("derived");
            assert!(again.provenance.replayed, "derived: {a} then {b}");
            assert_eq!(runs.load(Ordering::SeqCst), 2);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_reordered_payload_waits_for_the_running_call_and_gets_its_result() {
    for layer in both_paths(IdempotencyConfig::default()) {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = counting_tool(&runs, Duration::from_secs(2), ok_n);
        let a: Value = serde_json::from_str(r#"{"a":1,"b":2}"#).expect("json");
        let b: Value = serde_json::from_str(r#"{ "b": 2, "a": 1 }"#).expect("json");
        let first = tokio::spawn(layer.layer(svc.clone()).oneshot(pay_with(a, "k")));
        sleep(Duration::from_millis(1)).await;
        let dup = call(&svc, &layer, pay_with(b, "k")).await.expect("waits");
        let first = first.await.expect("join").expect("first");
        assert!(dup.provenance.replayed);
        assert_eq!(dup.output, first.output);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn another_payload_is_refused_after_success_failure_and_unknown_and_never_replays() {
    let answers: [Answer; 3] = [
        ok_n,
        |_| Err(ToolError::execution_failed("declined")),
        |_| Err(ToolError::timeout("lost")),
    ];
    for answer in answers {
        for layer in both_paths(IdempotencyConfig::default()) {
            let runs = Arc::new(AtomicUsize::new(0));
            let svc = counting_tool(&runs, Duration::ZERO, answer);
            let _ = call(&svc, &layer, pay("k")).await;
            for other in [
                json!({"amount": 43, "currency": "EUR"}),
                json!(null),
                json!({}),
            ] {
                let e = call(&svc, &layer, pay_with(other, "k"))
                    .await
                    .expect_err("reused");
                assert_eq!(e.kind(), ErrorKind::IdempotencyKeyReused);
                assert!(!e.is_retriable());
            }
            assert_eq!(runs.load(Ordering::SeqCst), 1);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_is_scoped_to_its_tool_and_its_caller() {
    for layer in both_paths(IdempotencyConfig::default()) {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = counting_tool(&runs, Duration::ZERO, ok_n);
        // A caller whose id looks like another scope's encoding, and keys that do too.
        let requests = [
            pay("k"),
            pay("k").caller("a"),
            pay("k").caller(""),
            pay("a:k"),
            pay("s1:a:g:k"),
            pay("k").caller("a:g:k"),
            pay("g:k").caller("a"),
            pay("k").caller("-"),
            pay("k").caller("s1:a"),
            ToolRequest::new("refund", json!({"amount": 42, "currency": "EUR"}))
                .kind(CallKind::Mutating)
                .idempotency_key("k"),
        ];
        for (i, req) in requests.iter().enumerate() {
            let r = call(&svc, &layer, req.clone()).await.expect("runs");
            assert!(!r.provenance.replayed, "request {i} saw another's record");
            assert_eq!(r.output, json!({"charge": i + 1}));
        }
        for (i, req) in requests.iter().enumerate() {
            let r = call(&svc, &layer, req.clone()).await.expect("replays");
            assert_eq!(r.output, json!({"charge": i + 1}), "request {i}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn attacker_chosen_keys_are_refused_or_kept_apart() {
    let layer = IdempotencyLayer::new(IdempotencyConfig {
        derive_keys: false,
        ..Default::default()
    })
    .expect("config");
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&runs, Duration::ZERO, ok_n);
    // Refused: too long, whatever the characters, and nothing runs.
    for key in ["x".repeat(256), "é".repeat(200), "\0".repeat(10_000)] {
        let e = call(&svc, &layer, pay(&key)).await.expect_err("too long");
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{} bytes", key.len());
        assert!(e.message().len() < 200, "the message does not echo the key");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Kept apart: distinct keys, each its own record (NFC and NFD forms are distinct keys).
    let keys = [
        "x".repeat(255),
        "e\u{301}".into(),
        "é".into(),
        "\u{7f}".into(),
        "a\tb".into(),
    ];
    for key in &keys {
        call(&svc, &layer, pay(key)).await.expect("runs");
    }
    assert_eq!(runs.load(Ordering::SeqCst), keys.len());
}

/// Many duplicates of one key at once, some dropped, some cancelled, with store faults:
/// the tool runs at most once at a time and, once a call succeeded, never again.
#[tokio::test(start_paused = true)]
async fn many_duplicates_of_one_key_run_the_tool_once() {
    for seed in 0..40u64 {
        let mut rng = Rng::new(seed);
        let plan = FaultPlan::new();
        let store = FaultyStore::new(Arc::new(InMemoryIdempotencyStore::new()), plan.clone());
        let cfg = IdempotencyConfig {
            on_pending: if rng.below(2) == 0 {
                OnPending::Wait
            } else {
                OnPending::FailFast
            },
            ..Default::default()
        };
        let layer = IdempotencyLayer::with_store(cfg, Arc::new(store)).expect("config");
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = counting_tool(&runs, Duration::from_millis(300), ok_n);
        plan.random(
            seed,
            0.1,
            &["claim", "get"],
            &[Fault::Fail, Fault::Delay(Duration::from_millis(20))],
        );
        let payloads = [
            r#"{"amount":42,"currency":"EUR"}"#,
            r#"{ "currency": "EUR", "amount": 42 }"#,
        ];
        let mut tasks = Vec::new();
        for i in 0..16 {
            let p: Value = serde_json::from_str(payloads[i % 2]).expect("json");
            let fut = layer.layer(svc.clone()).oneshot(pay_with(p, "k"));
            let start = Duration::from_millis(rng.below(200));
            let drop_after = (rng.below(4) == 0).then(|| Duration::from_millis(rng.below(400)));
            tasks.push(tokio::spawn(async move {
                sleep(start).await;
                match drop_after {
                    Some(d) => tokio::time::timeout(d, fut).await.ok(),
                    None => Some(fut.await),
                }
            }));
        }
        let mut outputs = Vec::new();
        for t in tasks {
            if let Some(Ok(r)) = t.await.expect("join") {
                outputs.push(r.output);
            }
        }
        let ran = runs.load(Ordering::SeqCst);
        assert!(ran <= 1, "seed {seed}: the tool ran {ran} times");
        for o in &outputs {
            assert_eq!(o, &json!({"charge": 1}), "seed {seed}");
        }
        plan.clear();
        // Once the dust settles, a duplicate never runs the tool again after a run.
        sleep(Duration::from_secs(60)).await;
        let _ = call(&svc, &layer, pay("k")).await;
        let after = runs.load(Ordering::SeqCst);
        if ran == 1 {
            assert_eq!(after, 1, "seed {seed}: ran again after a run");
        }
    }
}

/// A call dropped at any moment (every millisecond of a call whose store operations and
/// tool all take time): once its cleanup ran the key is never left PENDING, a mutation
/// that reached its tool is never run again, and one that did not is free to run.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_at_any_moment_leaves_no_claim_and_no_second_run() {
    for call_kind in [CallKind::Mutating, CallKind::Idempotent] {
        for drop_at in 0..160u64 {
            let plan = FaultPlan::new();
            let store = FaultyStore::new(Arc::new(InMemoryIdempotencyStore::new()), plan.clone());
            let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), Arc::new(store))
                .expect("config");
            let handle = layer.handle();
            for op in [
                "claim", "get", "complete", "fail", "release", "renew", "finish",
            ] {
                plan.always(op, Fault::Delay(Duration::from_millis(10)));
            }
            let runs = Arc::new(AtomicUsize::new(0));
            let svc = counting_tool(&runs, Duration::from_millis(100), ok_n);
            let req = || pay("k").kind(call_kind);
            let fut = layer.layer(svc.clone()).oneshot(req());
            let done = tokio::time::timeout(Duration::from_millis(drop_at), fut).await;
            let started = runs.load(Ordering::SeqCst);
            // The cleanup runs in the background, through the same slow store.
            sleep(Duration::from_secs(1)).await;
            let rec = handle.record("pay", None, "k").await.expect("get");
            let status = rec.as_ref().map(|r| r.status);
            assert_ne!(
                status,
                Some(toolshield_idempotency::RecordStatus::Pending),
                "{call_kind:?} dropped at {drop_at} ms: {rec:?}"
            );
            plan.clear();
            let next = call(&svc, &layer, req()).await;
            let total = runs.load(Ordering::SeqCst);
            match (call_kind, started, &done) {
                (_, _, Ok(Ok(_))) => {
                    assert_eq!(total, 1, "at {drop_at}: a finished call ran again")
                }
                (CallKind::Mutating, 1, _) => {
                    assert_eq!(total, 1, "{call_kind:?} at {drop_at}: ran twice: {next:?}");
                    assert!(next.is_err() || next.as_ref().is_ok_and(|r| r.provenance.replayed));
                }
                (_, 0, _) => {
                    assert_eq!(total, 1, "{call_kind:?} at {drop_at}: never ran: {next:?}");
                    assert!(next.is_ok(), "{call_kind:?} at {drop_at}: {next:?}");
                }
                _ => assert!(total <= 2, "{call_kind:?} at {drop_at}"),
            }
        }
    }
}

/// A tool's answer whose record could not be written for a while (the store failing past
/// `record_retry`, then back): the key never turns free, and nothing runs twice.
#[tokio::test(start_paused = true)]
async fn an_answer_that_could_not_be_recorded_never_frees_the_key() {
    let answers: [(Answer, CallKind); 5] = [
        (ok_n, CallKind::Mutating),
        (ok_n, CallKind::Idempotent),
        (
            |_| Err(ToolError::execution_failed("declined")),
            CallKind::Mutating,
        ),
        (
            |_| Err(ToolError::execution_failed("declined")),
            CallKind::Idempotent,
        ),
        (|_| Err(ToolError::timeout("lost")), CallKind::Mutating),
    ];
    for (answer, call_kind) in answers {
        let plan = FaultPlan::new();
        let store = FaultyStore::new(Arc::new(InMemoryIdempotencyStore::new()), plan.clone());
        let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), Arc::new(store))
            .expect("config");
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = counting_tool(&runs, Duration::ZERO, answer);
        for op in ["complete", "fail"] {
            plan.always(op, Fault::Fail);
        }
        let first = tokio::spawn(layer.layer(svc.clone()).oneshot(pay("k").kind(call_kind)));
        sleep(Duration::from_secs(3)).await;
        plan.clear();
        let first = first.await.expect("join");
        for _ in 0..3 {
            sleep(Duration::from_secs(20)).await;
            let next = call(&svc, &layer, pay("k").kind(call_kind)).await;
            assert_eq!(
                runs.load(Ordering::SeqCst),
                1,
                "{call_kind:?} {first:?}: ran again: {next:?}"
            );
        }
    }
}

/// A run budget inside the layer turned the call away before the tool ran: that is no
/// answer of the tool, so the next call with the key (another run, with budget left) runs
/// instead of being told the budget is spent.
#[tokio::test(start_paused = true)]
async fn a_budget_rejection_from_inside_frees_the_key_for_the_next_call() {
    let layer = IdempotencyLayer::new(IdempotencyConfig::default()).expect("config");
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&runs, Duration::ZERO, |n| {
        if n == 1 {
            Err(ToolError::new(
                ErrorKind::BudgetExhausted,
                "run budget spent",
            ))
        } else {
            ok_n(n)
        }
    });
    let e = call(&svc, &layer, pay("k").run_id("run-1"))
        .await
        .expect_err("no budget");
    assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
    let ok = call(&svc, &layer, pay("k").run_id("run-2"))
        .await
        .expect("another run with budget left runs the call");
    assert_eq!(ok.output, json!({"charge": 2}));
}

/// Integers beyond 2^53 have one canonical JSON form for many values (RFC 8785 writes
/// numbers as doubles): a fingerprint must still tell two account numbers apart, or a
/// transfer to one is deduped against, or replays the result of, a transfer to the other.
#[tokio::test(start_paused = true)]
async fn payloads_that_differ_only_in_a_large_integer_have_different_fingerprints() {
    let big = [
        (
            json!({"to": 9_007_199_254_740_993u64}),
            json!({"to": 9_007_199_254_740_992u64}),
        ),
        (
            json!({"to": [-9_007_199_254_740_993i64]}),
            json!({"to": [-9_007_199_254_740_992i64]}),
        ),
        (
            json!({"a": {"to": u64::MAX}}),
            json!({"a": {"to": u64::MAX - 1}}),
        ),
    ];
    for layer in both_paths(IdempotencyConfig::default()) {
        for (i, (a, b)) in big.iter().enumerate() {
            let runs = Arc::new(AtomicUsize::new(0));
            let svc = counting_tool(&runs, Duration::ZERO, ok_n);
            // Derived keys: two different transfers, two executions.
            let derived =
                |p: &Value| ToolRequest::new("transfer", p.clone()).kind(CallKind::Mutating);
            call(&svc, &layer, derived(a))
                .await
                .expect("first transfer");
            let second = call(&svc, &layer, derived(b))
                .await
                .expect("second transfer");
            assert!(!second.provenance.replayed, "{b} was deduped against {a}");
            assert_eq!(runs.load(Ordering::SeqCst), 2);
            // A given key reused for the other transfer is refused, not replayed.
            let key = format!("k{i}");
            call(&svc, &layer, pay_with(a.clone(), &key))
                .await
                .expect("first");
            let e = call(&svc, &layer, pay_with(b.clone(), &key))
                .await
                .expect_err("another payload");
            assert_eq!(e.kind(), ErrorKind::IdempotencyKeyReused, "{a} then {b}");
            // The same large integer, with keys in another order, is still the same payload.
            let again = call(&svc, &layer, pay_with(a.clone(), &key))
                .await
                .expect("replay");
            assert!(again.provenance.replayed);
            assert_eq!(runs.load(Ordering::SeqCst), 3);
        }
        let a: Value =
            serde_json::from_str(r#"{"x":9007199254740993,"y":{"p":1,"q":18446744073709551615}}"#)
                .expect("json");
        let b: Value = serde_json::from_str(
            r#"{"y":{"q":18446744073709551615,"p":1.0},"x":9007199254740993}"#,
        )
        .expect("json");
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = counting_tool(&runs, Duration::ZERO, ok_n);
        call(&svc, &layer, pay_with(a, "same"))
            .await
            .expect("first");
        let again = call(&svc, &layer, pay_with(b, "same"))
            .await
            .expect("same payload");
        assert!(again.provenance.replayed);
    }
}
