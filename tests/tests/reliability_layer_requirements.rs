//! The idempotency requirements of the Tool Reliability Layer (its contract as
//! docs/migration.md maps it, and the decisions of docs/idempotency.md), asserted through the
//! default stack a user builds (`Shield` and its router): the key lifecycle (PENDING,
//! COMPLETED, FAILED, expiry) at its boundaries, the same key with another payload, clones
//! of one request racing, duplicates arriving while the first call is in flight and after
//! it ended each way, and the dedupe across two Redis store handles (two replicas),
//! including a Redis outage between a claim and its outcome.
//!
//! In-memory tests run on tokio's paused clock; Redis tests start their own redis-server.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::{sleep, sleep_until, Instant};
use toolshield::config::ShieldConfig;
use toolshield::shield::{BoxTool, Shield, ToolRouter};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse, ToolResult};
use toolshield_idempotency::RecordStatus;
use tower::{service_fn, ServiceExt};

const MS: Duration = Duration::from_millis(1);

/// The wall clock, in seconds since the epoch.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A tool that counts its executions and answers as `script(execution number)` says.
fn scripted<F, Fut>(calls: &Arc<AtomicU32>, script: F) -> BoxTool
where
    F: Fn(u32) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<ToolResponse, ToolError>> + Send + 'static,
{
    let calls = calls.clone();
    BoxTool::new(service_fn(move |_req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        script(n)
    }))
}

fn counter() -> Arc<AtomicU32> {
    Arc::new(AtomicU32::new(0))
}

fn config(toml: &str) -> ShieldConfig {
    ShieldConfig::from_toml_str(toml).expect("valid config")
}

fn router(shield: &Shield, tools: Vec<(&str, BoxTool)>) -> ToolRouter {
    let mut b = shield.router();
    for (name, tool) in tools {
        b = b.tool(name, tool);
    }
    b.build().expect("valid tool names")
}

/// A mutation of `tool` (declared `mutating` in every configuration below) under `key`.
fn mutation(tool: &str, amount: u64, key: &str) -> ToolRequest {
    ToolRequest::new(tool, json!({ "amount": amount })).idempotency_key(key)
}

fn charge(n: u32) -> Result<ToolResponse, ToolError> {
    Ok(ToolResponse::new(json!({ "charge": n })))
}

fn unavailable() -> Result<ToolResponse, ToolError> {
    Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
}

fn declined() -> Result<ToolResponse, ToolError> {
    Err(ToolError::execution_failed("card declined"))
}

const PAY: &str = "[tools.pay]\nkind = \"mutating\"\n";

// ------------------------------------------------------------ COMPLETED and its expiry

/// Tool Reliability Layer contract: the TTL of a record is configurable per tool, 24 h by
/// default. A COMPLETED record is replayed (`fromCache = true`) until the end of its tool's
/// `record_ttl`, and the key runs again just after it; another tool keeps the default.
#[tokio::test(start_paused = true)]
async fn a_completed_key_replays_until_its_tools_record_ttl_and_runs_again_after_it() {
    let (pay_calls, refund_calls) = (counter(), counter());
    let shield = Shield::from_config(config(
        "[tools.pay]\nkind = \"mutating\"\nidempotency = { record_ttl = \"1h\" }\n\
         [tools.refund]\nkind = \"mutating\"\n",
    ))
    .expect("shield");
    let r = router(
        &shield,
        vec![
            ("pay", scripted(&pay_calls, |n| async move { charge(n) })),
            (
                "refund",
                scripted(&refund_calls, |n| async move { charge(n) }),
            ),
        ],
    );

    let first = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    r.clone().oneshot(mutation("refund", 5, "k")).await.unwrap();
    let done = Instant::now();
    let rec = shield
        .idempotency("pay")
        .record_for(&mutation("pay", 5, "k"))
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(rec.status, RecordStatus::Completed);
    assert!(rec.result.is_some() && rec.error.is_none());
    let left = rec.expires_at.timestamp() - unix_now();
    assert!(
        (3590..=3601).contains(&left),
        "expires_at is 1 h away: {left} s"
    );

    sleep_until(done + Duration::from_secs(3600) - MS).await;
    let replay = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    assert!(replay.provenance.replayed, "replayed within its 1 h");
    assert_eq!(replay.output, first.output);
    assert!(ToolResult::from(Ok::<_, ToolError>(replay)).from_cache);
    assert_eq!(pay_calls.load(Ordering::SeqCst), 1);

    sleep_until(done + Duration::from_secs(3600) + MS).await;
    let again = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    assert!(
        !again.provenance.replayed,
        "the record expired with its tool's TTL"
    );
    assert_eq!(again.output, json!({ "charge": 2 }));
    assert_eq!(pay_calls.load(Ordering::SeqCst), 2);

    let other = r.clone().oneshot(mutation("refund", 5, "k")).await.unwrap();
    assert!(
        other.provenance.replayed,
        "another tool keeps the 24 h default"
    );
    sleep_until(done + Duration::from_secs(24 * 3600) - MS).await;
    let late = r.clone().oneshot(mutation("refund", 5, "k")).await.unwrap();
    assert!(late.provenance.replayed, "replayed just before 24 h");
    sleep_until(done + Duration::from_secs(24 * 3600) + MS).await;
    let expired = r.clone().oneshot(mutation("refund", 5, "k")).await.unwrap();
    assert!(!expired.provenance.replayed, "runs again just after 24 h");
    assert_eq!(refund_calls.load(Ordering::SeqCst), 2);
}

// ------------------------------------------------------------ FAILED and its expiry

/// docs/idempotency.md: a non-retriable failure is FAILED, replayed (nothing runs)
/// for `failed_ttl` (60 s) to stop tight loops, then the key may run again.
#[tokio::test(start_paused = true)]
async fn a_non_retriable_failure_is_replayed_for_its_failed_ttl_then_runs_again() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let tool = scripted(&calls, |n| async move {
        if n == 1 {
            declined()
        } else {
            charge(n)
        }
    });
    let r = router(&shield, vec![("pay", tool)]);

    let e = r
        .clone()
        .oneshot(mutation("pay", 5, "k"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ExecutionFailed);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never retried");
    let failed = Instant::now();
    let rec = shield
        .idempotency("pay")
        .record_for(&mutation("pay", 5, "k"))
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(rec.status, RecordStatus::Failed);

    sleep_until(failed + Duration::from_secs(60) - MS).await;
    let replayed = r
        .clone()
        .oneshot(mutation("pay", 5, "k"))
        .await
        .unwrap_err();
    assert_eq!(replayed.kind(), ErrorKind::ExecutionFailed);
    assert_eq!(replayed.message(), e.message(), "the stored error");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a FAILED key does not run");

    sleep_until(failed + Duration::from_secs(60) + MS).await;
    let ok = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    assert_eq!(ok.output, json!({ "charge": 2 }));
    assert!(!ok.provenance.replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// docs/idempotency.md: retriable failures release the key. A keyed mutation whose retries
/// are all used up frees it, so a duplicate right after runs the call.
#[tokio::test(start_paused = true)]
async fn a_retriable_failure_that_uses_up_its_retries_frees_the_key() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let tool = scripted(&calls, |n| async move {
        if n <= 3 {
            unavailable()
        } else {
            charge(n)
        }
    });
    let r = router(&shield, vec![("pay", tool)]);

    let e = r
        .clone()
        .oneshot(mutation("pay", 5, "k"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "a keyed mutation is retried"
    );
    assert!(shield
        .idempotency("pay")
        .record_for(&mutation("pay", 5, "k"))
        .await
        .unwrap()
        .is_none());

    let ok = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    assert!(!ok.provenance.replayed);
    assert_eq!(ok.output, json!({ "charge": 4 }));
}

/// docs/idempotency.md: a mutation without a key gets a derived one, under
/// which it is deduplicated and may be retried; with key derivation off it runs once per
/// call, never retried and never deduplicated.
#[tokio::test(start_paused = true)]
async fn a_keyless_mutation_is_retried_and_deduplicated_only_under_a_derived_key() {
    for derive in [true, false] {
        let calls = counter();
        let shield = Shield::from_config(config(&format!(
            "[tools.pay]\nkind = \"mutating\"\nidempotency = {{ derive_keys = {derive} }}\n"
        )))
        .expect("shield");
        let tool = scripted(&calls, |n| async move {
            if n == 1 {
                unavailable()
            } else {
                charge(n)
            }
        });
        let r = router(&shield, vec![("pay", tool)]);
        let keyless = || ToolRequest::new("pay", json!({ "amount": 5 })).caller("agent-1");

        let first = r.clone().oneshot(keyless()).await;
        let after_first = calls.load(Ordering::SeqCst);
        let second = r.clone().oneshot(keyless()).await;
        if derive {
            assert_eq!(after_first, 2, "two attempts");
            let first = first.expect("retried under its derived key");
            assert_eq!(first.output, json!({ "charge": 2 }));
            let second = second.unwrap();
            assert!(
                second.provenance.replayed,
                "deduplicated by the derived key"
            );
            assert_eq!(calls.load(Ordering::SeqCst), 2);
        } else {
            let e = first.expect_err("a keyless mutation is attempted once");
            assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
            assert_eq!(after_first, 1);
            let second = second.unwrap();
            assert!(!second.provenance.replayed, "no dedupe without a key");
            let third = r.clone().oneshot(keyless()).await.unwrap();
            assert!(!third.provenance.replayed);
            assert_eq!(calls.load(Ordering::SeqCst), 3);
        }
    }
}

// ------------------------------------------------------------ PENDING and its lease

/// docs/idempotency.md: a PENDING claim has a lease (30 s); a duplicate that finds it live
/// is told `IN_PROGRESS` (fail fast), up to the last millisecond of the lease of an owner
/// that died; just after it, the claim is taken over and the call runs.
#[tokio::test(start_paused = true)]
async fn a_claim_whose_owner_died_holds_its_key_for_exactly_its_lease() {
    let calls = counter();
    let shield = Shield::from_config(config(
        "[tools.pay]\nkind = \"mutating\"\nidempotency = { on_pending = \"fail_fast\" }\n",
    ))
    .expect("shield");
    let tool = scripted(&calls, |n| async move {
        if n == 1 {
            sleep(Duration::from_secs(3600)).await;
        }
        charge(n)
    });
    let r = router(&shield, vec![("pay", tool)]);

    let claimed = Instant::now();
    let mut owner = Box::pin(r.clone().oneshot(mutation("pay", 5, "k")));
    tokio::select! {
        biased;
        _ = &mut owner => panic!("the first call runs for an hour"),
        () = sleep(MS) => {}
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    #[allow(clippy::mem_forget)]
    std::mem::forget(owner); // the process dies: no cleanup, no renewal

    let rec = shield
        .idempotency("pay")
        .record_for(&mutation("pay", 5, "k"))
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(rec.status, RecordStatus::Pending);

    sleep_until(claimed + Duration::from_secs(30) - MS).await;
    let e = r
        .clone()
        .oneshot(mutation("pay", 5, "k"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InProgress, "the lease still holds");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    sleep_until(claimed + Duration::from_secs(30) + MS).await;
    let taken = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    assert_eq!(taken.output, json!({ "charge": 2 }));
    assert_eq!(shield.idempotency("pay").counts().takeovers, 1);
}

/// Past the lease of a dead owner the key stays its payload's for one more lease (the
/// dead owner may have run it): another payload is `IDEMPOTENCY_KEY_REUSED` up to the end
/// of that window, and free just after it.
#[tokio::test(start_paused = true)]
async fn a_dead_owners_key_is_its_payloads_until_one_lease_past_its_lease() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let tool = scripted(&calls, |n| async move {
        if n == 1 {
            sleep(Duration::from_secs(3600)).await;
        }
        charge(n)
    });
    let r = router(&shield, vec![("pay", tool)]);

    let claimed = Instant::now();
    let mut owner = Box::pin(r.clone().oneshot(mutation("pay", 5, "k")));
    tokio::select! {
        biased;
        _ = &mut owner => panic!("the first call runs for an hour"),
        () = sleep(MS) => {}
    }
    #[allow(clippy::mem_forget)]
    std::mem::forget(owner); // the process dies

    sleep_until(claimed + Duration::from_secs(60) - MS).await;
    let e = r
        .clone()
        .oneshot(mutation("pay", 6, "k"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdempotencyKeyReused);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    sleep_until(claimed + Duration::from_secs(60) + MS).await;
    let ok = r.clone().oneshot(mutation("pay", 6, "k")).await.unwrap();
    assert_eq!(ok.output, json!({ "charge": 2 }));
}

/// The lease boundaries hold for a claim its owner renewed before dying: the key is
/// held (`IN_PROGRESS`) until a lease past the last renewal, then taken over by its own
/// payload; another payload is refused for one more lease after that.
#[tokio::test(start_paused = true)]
async fn a_renewed_claims_boundaries_follow_its_last_renewal() {
    let shield = Shield::from_config(config(
        "[tools.pay]\nkind = \"mutating\"\nidempotency = { on_pending = \"fail_fast\" }\n",
    ))
    .expect("shield");
    let calls = counter();
    let tool = scripted(&calls, |n| async move {
        if n == 1 {
            sleep(Duration::from_secs(3600)).await;
        }
        charge(n)
    });
    let r = router(&shield, vec![("pay", tool)]);

    let claimed = Instant::now();
    let mut owner = Box::pin(r.clone().oneshot(mutation("pay", 5, "k")));
    tokio::select! {
        biased;
        _ = &mut owner => panic!("the first call runs for an hour"),
        () = sleep_until(claimed + Duration::from_secs(25)) => {}
    }
    #[allow(clippy::mem_forget)]
    std::mem::forget(owner); // dies after renewing at 10 s and 20 s
    let lease_end = claimed + Duration::from_secs(50);

    sleep_until(lease_end - MS).await;
    let e = r
        .clone()
        .oneshot(mutation("pay", 5, "k"))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::InProgress,
        "held until 30 s past the last renewal"
    );
    let e = r
        .clone()
        .oneshot(mutation("pay", 6, "k"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdempotencyKeyReused);

    sleep_until(lease_end + Duration::from_secs(30) - MS).await;
    let e = r
        .clone()
        .oneshot(mutation("pay", 6, "k"))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::IdempotencyKeyReused,
        "another payload is refused for a lease past the lapsed one"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let taken = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    assert_eq!(taken.output, json!({ "charge": 2 }));
    assert_eq!(shield.idempotency("pay").counts().takeovers, 1);
}

/// Tool Reliability Layer contract: FAILED "allows manual or delayed retry". Forgetting
/// the record (the documented flush) lets the key run at once.
#[tokio::test(start_paused = true)]
async fn a_failed_key_forgotten_by_hand_runs_again_at_once() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let tool = scripted(&calls, |n| async move {
        if n == 1 {
            declined()
        } else {
            charge(n)
        }
    });
    let r = router(&shield, vec![("pay", tool)]);
    r.clone()
        .oneshot(mutation("pay", 5, "k"))
        .await
        .unwrap_err();
    assert!(shield
        .idempotency("pay")
        .forget_request(&mutation("pay", 5, "k"))
        .await
        .unwrap());
    let ok = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    assert_eq!(ok.output, json!({ "charge": 2 }));
}

/// docs/idempotency.md: a mutating call that times out after it was sent is
/// `OUTCOME_UNKNOWN`, not retried, and its record is kept for reconciliation
/// (`record_ttl`): a duplicate is told the outcome is unknown until it expires, and runs
/// just after.
#[tokio::test(start_paused = true)]
async fn a_mutation_timed_out_after_it_was_sent_is_kept_outcome_unknown_for_its_record_ttl() {
    let calls = counter();
    let shield = Shield::from_config(config(
        "[tools.pay]\nkind = \"mutating\"\ntimeout = { attempt = \"1s\" }\n\
         idempotency = { record_ttl = \"2h\" }\n",
    ))
    .expect("shield");
    let tool = scripted(&calls, |n| async move {
        if n == 1 {
            sleep(Duration::from_secs(5)).await;
        }
        charge(n)
    });
    let r = router(&shield, vec![("pay", tool)]);

    let e = r
        .clone()
        .oneshot(mutation("pay", 5, "k"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never retried");
    let ended = Instant::now();

    sleep_until(ended + Duration::from_secs(2 * 3600) - MS).await;
    let e = r
        .clone()
        .oneshot(mutation("pay", 5, "k"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    sleep_until(ended + Duration::from_secs(2 * 3600) + MS).await;
    let ok = r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    assert_eq!(ok.output, json!({ "charge": 2 }));
}

// ------------------------------------------------------------ duplicates in flight

/// The reliability test matrix, "duplicate concurrent request": a duplicate that arrives
/// while the first call is between two attempts (retrying a 503) waits for the first call's
/// final result; the tool runs only the first call's attempts.
#[tokio::test(start_paused = true)]
async fn a_duplicate_arriving_while_the_first_call_retries_gets_its_final_result() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let tool = scripted(&calls, |n| async move {
        sleep(Duration::from_millis(100)).await;
        if n == 1 {
            unavailable()
        } else {
            charge(n)
        }
    });
    let r = router(&shield, vec![("pay", tool)]);

    let (first, dup) = tokio::join!(r.clone().oneshot(mutation("pay", 5, "k")), async {
        sleep(Duration::from_millis(101)).await; // the first attempt has failed
        r.clone().oneshot(mutation("pay", 5, "k")).await
    });
    let (first, dup) = (first.unwrap(), dup.unwrap());
    assert_eq!(first.output, json!({ "charge": 2 }));
    assert_eq!(dup.output, first.output);
    assert!(dup.provenance.replayed, "served from the dedupe store");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the first call's two attempts"
    );
}

/// A duplicate waiting on a call that then fails for good gets that failure; the tool
/// runs once.
#[tokio::test(start_paused = true)]
async fn a_duplicate_waiting_on_a_call_that_fails_for_good_gets_that_failure() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let tool = scripted(&calls, |_| async move {
        sleep(Duration::from_millis(200)).await;
        declined()
    });
    let r = router(&shield, vec![("pay", tool)]);

    let (first, dup) = tokio::join!(r.clone().oneshot(mutation("pay", 5, "k")), async {
        sleep(Duration::from_millis(10)).await;
        r.clone().oneshot(mutation("pay", 5, "k")).await
    });
    let (first, dup) = (first.unwrap_err(), dup.unwrap_err());
    assert_eq!(first.kind(), ErrorKind::ExecutionFailed);
    assert_eq!(dup.kind(), ErrorKind::ExecutionFailed);
    assert_eq!(dup.message(), first.message());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A duplicate waiting on a call that fails retriably (which frees the key) is not handed
/// a transient failure of another call: it claims the freed key and runs the call itself.
#[tokio::test(start_paused = true)]
async fn a_duplicate_waiting_on_a_call_that_fails_retriably_runs_the_call_itself() {
    let calls = counter();
    let shield = Shield::from_config(config(
        "[tools.pay]\nkind = \"mutating\"\nretry = { max_attempts = 1 }\n",
    ))
    .expect("shield");
    let tool = scripted(&calls, |n| async move {
        sleep(Duration::from_millis(200)).await;
        if n == 1 {
            unavailable()
        } else {
            charge(n)
        }
    });
    let r = router(&shield, vec![("pay", tool)]);

    let (first, dup) = tokio::join!(r.clone().oneshot(mutation("pay", 5, "k")), async {
        sleep(Duration::from_millis(10)).await;
        r.clone().oneshot(mutation("pay", 5, "k")).await
    });
    assert_eq!(first.unwrap_err().kind(), ErrorKind::UpstreamUnavailable);
    let dup = dup.expect("the duplicate ran the call");
    assert_eq!(dup.output, json!({ "charge": 2 }));
    assert!(!dup.provenance.replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A duplicate waiting on a mutation whose caller gives up (drops its future) while the
/// tool runs is told `OUTCOME_UNKNOWN`: the mutation may have happened, so it never runs
/// it a second time.
#[tokio::test(start_paused = true)]
async fn a_duplicate_waiting_on_a_mutation_its_caller_dropped_is_told_outcome_unknown() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let tool = scripted(&calls, |n| async move {
        sleep(Duration::from_millis(500)).await;
        charge(n)
    });
    let r = router(&shield, vec![("pay", tool)]);

    let first = tokio::spawn(r.clone().oneshot(mutation("pay", 5, "k")));
    let (_, dup) = tokio::join!(
        async {
            sleep(Duration::from_millis(100)).await;
            first.abort();
        },
        async {
            sleep(Duration::from_millis(10)).await;
            r.clone().oneshot(mutation("pay", 5, "k")).await
        }
    );
    assert_eq!(dup.unwrap_err().kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Two clones of one request racing (`router.clone().oneshot(req.clone())`), with a
/// given key and with a derived one: one execution, both get its result, one of them as
/// a replay.
#[tokio::test(start_paused = true)]
async fn two_clones_of_one_request_racing_run_the_tool_once() {
    let given = mutation("pay", 5, "k");
    let derived = ToolRequest::new("pay", json!({ "amount": 6 })).caller("agent-1");
    for req in [given, derived] {
        let calls = counter();
        let shield = Shield::from_config(config(PAY)).expect("shield");
        let tool = scripted(&calls, |n| async move {
            sleep(Duration::from_millis(50)).await;
            charge(n)
        });
        let r = router(&shield, vec![("pay", tool)]);
        let (a, b) = tokio::join!(
            r.clone().oneshot(req.clone()),
            r.clone().oneshot(req.clone())
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one execution");
        assert_eq!(a.output, b.output);
        assert!(
            a.provenance.replayed != b.provenance.replayed,
            "exactly one is the replay"
        );
        assert_eq!(shield.idempotency("pay").counts().executions, 1);
    }
}

// ------------------------------------------------------------ same key, other payload

/// docs/idempotency.md and the IETF `Idempotency-Key` draft: the same key with another
/// payload is `IDEMPOTENCY_KEY_REUSED` and nothing runs, while the first call runs (at
/// once, not after a wait), after it completed and after it failed; it is not retried. Once
/// a FAILED record expired, the key is free for any payload.
#[tokio::test(start_paused = true)]
async fn another_payload_under_a_used_key_is_refused_at_every_stage_and_never_runs() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let tool = scripted(&calls, |n| async move {
        sleep(Duration::from_millis(200)).await;
        if n == 2 {
            declined()
        } else {
            charge(n)
        }
    });
    let r = router(&shield, vec![("pay", tool)]);

    // While the first call runs.
    let (first, other) = tokio::join!(r.clone().oneshot(mutation("pay", 5, "done")), async {
        sleep(Duration::from_millis(10)).await;
        let asked = Instant::now();
        let res = r.clone().oneshot(mutation("pay", 6, "done")).await;
        (res, asked.elapsed())
    });
    first.unwrap();
    let (other, took) = other;
    assert_eq!(other.unwrap_err().kind(), ErrorKind::IdempotencyKeyReused);
    assert!(
        took < Duration::from_millis(50),
        "refused at once: {took:?}"
    );

    // After it completed.
    let e = r
        .clone()
        .oneshot(mutation("pay", 6, "done"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdempotencyKeyReused);
    assert!(!e.kind().is_retriable());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // After a failure that is kept.
    r.clone()
        .oneshot(mutation("pay", 5, "failed"))
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let failed = Instant::now();
    let e = r
        .clone()
        .oneshot(mutation("pay", 6, "failed"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdempotencyKeyReused);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // The FAILED record expired: the key is free.
    sleep_until(failed + Duration::from_secs(61)).await;
    let ok = r
        .clone()
        .oneshot(mutation("pay", 6, "failed"))
        .await
        .unwrap();
    assert_eq!(ok.output, json!({ "charge": 3 }));
}

// ------------------------------------------------------------ Redis: two replicas

/// Two replicas on one real redis-server. These run on real time, not tokio's paused
/// clock: leases and record expiries are kept by the server against its own clock, and a
/// killed or paused server is waited for in short real pauses.
mod redis {
    use super::*;
    use toolshield::cache::InMemoryCacheStore;
    use toolshield_idempotency::IdempotencyStore;
    use toolshield_redis::testing::{private_persistent_redis, private_redis, unique_prefix};
    use toolshield_redis::{RedisConfig, RedisConnection, RedisIdempotencyStore};

    /// One replica: its own connection to the server and its own stack.
    async fn replica(url: &str, prefix: &str, toml: &str, tool: BoxTool) -> (Shield, ToolRouter) {
        let conn = RedisConnection::connect(
            RedisConfig::from_url(url)
                .with_key_prefix(prefix)
                .with_op_timeout(Duration::from_millis(300)),
        )
        .await
        .expect("the test redis answers");
        let store: Arc<dyn IdempotencyStore> = Arc::new(RedisIdempotencyStore::new(conn));
        let shield = Shield::with_stores(config(toml), Arc::new(InMemoryCacheStore::new()), store)
            .expect("shield");
        let r = router(&shield, vec![("pay", tool)]);
        (shield, r)
    }

    /// Every outcome recorded by one replica is honoured by another on the same Redis:
    /// a COMPLETED key replays, another payload is refused, a FAILED key replays its
    /// failure, a retriably failed key runs, and a duplicate sent while the first replica
    /// runs the call waits for its result.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_replicas_on_one_redis_honour_each_others_records() {
        let test = "two_replicas_on_one_redis_honour_each_others_records";
        let Some(server) = private_redis(test) else {
            return;
        };
        let prefix = unique_prefix();
        let calls = counter();
        // The amount decides the answer: 1 declines, 2 is unavailable, others charge.
        let answer = |calls: &Arc<AtomicU32>| {
            let calls = calls.clone();
            BoxTool::new(service_fn(move |req: ToolRequest| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let amount = req.payload()["amount"].as_u64();
                async move {
                    sleep(Duration::from_millis(300)).await;
                    match amount {
                        Some(1) => declined(),
                        Some(2) => unavailable(),
                        _ => charge(n),
                    }
                }
            }))
        };
        let toml = "[tools.pay]\nkind = \"mutating\"\nretry = { max_attempts = 1 }\n\
                    idempotency = { record_ttl = \"2h\" }\n";
        let (_a_shield, a) = replica(&server.url(), &prefix, toml, answer(&calls)).await;
        let (b_shield, b) = replica(&server.url(), &prefix, toml, answer(&calls)).await;

        // Completed on A, replayed on B; another payload refused on B.
        let first = a.clone().oneshot(mutation("pay", 5, "done")).await.unwrap();
        let replay = b.clone().oneshot(mutation("pay", 5, "done")).await.unwrap();
        assert!(replay.provenance.replayed);
        assert_eq!(replay.output, first.output);
        assert_eq!(
            replay.provenance.fetched_at, first.provenance.fetched_at,
            "the original fetch time"
        );
        let e = b
            .clone()
            .oneshot(mutation("pay", 6, "done"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IdempotencyKeyReused);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let rec = b_shield
            .idempotency("pay")
            .record_for(&mutation("pay", 5, "done"))
            .await
            .unwrap()
            .expect("A's record, read by B");
        assert_eq!(rec.status, RecordStatus::Completed);
        let left = rec.expires_at.timestamp() - unix_now();
        assert!(
            (2 * 3590..=2 * 3601).contains(&left),
            "the tool's 2 h TTL: {left} s"
        );

        // Failed for good on A: B gets the failure without running.
        let e = a
            .clone()
            .oneshot(mutation("pay", 1, "declined"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ExecutionFailed);
        let e = b
            .clone()
            .oneshot(mutation("pay", 1, "declined"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ExecutionFailed);
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        // Failed retriably on A: the key is free, B runs it.
        let e = a
            .clone()
            .oneshot(mutation("pay", 2, "flaky"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
        let e = b
            .clone()
            .oneshot(mutation("pay", 2, "flaky"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable, "B ran it again");
        assert_eq!(calls.load(Ordering::SeqCst), 4);

        // In flight on A, and the same request (one execution id) resent to B, as a load
        // balancer retrying it would: B waits for A's result.
        let req = mutation("pay", 7, "racing");
        let (on_a, on_b) = tokio::join!(a.clone().oneshot(req.clone()), async {
            sleep(Duration::from_millis(100)).await;
            b.clone().oneshot(req.clone()).await
        });
        let (on_a, on_b) = (on_a.unwrap(), on_b.unwrap());
        assert_eq!(on_a.output, on_b.output);
        assert!(on_b.provenance.replayed);
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(b_shield.idempotency("pay").counts().executions, 1);
    }

    /// On Redis as in memory, a claim its owner renewed many times before dying keeps
    /// its key for its payload for one lease past its last lease: another replica's call
    /// with another payload is refused, and a call with the same payload takes it over
    /// (reported as a takeover).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewed_claim_of_a_dead_replica_keeps_its_key_for_its_payload_on_redis() {
        let test = "a_renewed_claim_of_a_dead_replica_keeps_its_key_for_its_payload_on_redis";
        let Some(server) = private_redis(test) else {
            return;
        };
        let prefix = unique_prefix();
        let calls = counter();
        let tool = scripted(&calls, |n| async move {
            if n == 1 {
                sleep(Duration::from_secs(3600)).await;
            }
            charge(n)
        });
        let toml = "[tools.pay]\nkind = \"mutating\"\n\
                    idempotency = { lease = \"1s\", on_pending = \"fail_fast\" }\n";
        let (_a_shield, a) = replica(&server.url(), &prefix, toml, tool.clone()).await;
        let (b_shield, b) = replica(&server.url(), &prefix, toml, tool).await;

        // A claims and renews for 4 leases, then dies (no cleanup, no renewal).
        let a_runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dying = std::thread::spawn(move || {
            a_runtime.block_on(async move {
                let mut owner = Box::pin(a.oneshot(mutation("pay", 5, "k")));
                tokio::select! {
                    _ = &mut owner => panic!("the first call runs for an hour"),
                    () = sleep(Duration::from_secs(4)) => {}
                }
                #[allow(clippy::mem_forget)]
                std::mem::forget(owner);
            });
            // The runtime is dropped here: the replica is gone.
        });
        dying.join().expect("replica A");
        let died = std::time::Instant::now();
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        // Past A's lease, within the next one: the key is still A's payload's.
        sleep(Duration::from_millis(1300)).await;
        let e = b
            .clone()
            .oneshot(mutation("pay", 6, "k"))
            .await
            .unwrap_err();
        assert!(
            died.elapsed() < Duration::from_millis(1900),
            "the check ran within the window"
        );
        assert_eq!(
            e.kind(),
            ErrorKind::IdempotencyKeyReused,
            "another payload within a lease after the lapse of a renewed claim"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "nothing ran for 6");
        let taken = b.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
        assert_eq!(taken.output, json!({ "charge": 2 }));
        assert_eq!(
            b_shield.idempotency("pay").counts().takeovers,
            1,
            "a takeover of a renewed claim is reported"
        );
    }

    /// Redis goes down after a call claimed its key and comes back (with its data) while
    /// the claim's lease still runs. The caller gets the tool's answer, marked unrecorded
    /// when the outcome could not be written in time; the key must not become free again
    /// for a duplicate: it never runs the mutation a second time, under either store
    /// error policy.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_outage_between_claim_and_outcome_never_runs_the_mutation_twice() {
        let test = "a_redis_outage_between_claim_and_outcome_never_runs_the_mutation_twice";
        for (on_store_error, fault) in [
            ("fail_closed", "kill"),
            ("fail_open", "kill"),
            ("fail_closed", "pause"),
            ("fail_open", "pause"),
        ] {
            let policy = format!("{on_store_error}/{fault}");
            let Some(mut server) = private_persistent_redis(test) else {
                return;
            };
            let prefix = unique_prefix();
            let calls = counter();
            let (go, go_rx) = tokio::sync::watch::channel(false);
            let tool = {
                let calls = calls.clone();
                BoxTool::new(service_fn(move |_req: ToolRequest| {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut go = go_rx.clone();
                    async move {
                        if n == 1 {
                            let _ = go.wait_for(|g| *g).await;
                        }
                        charge(n)
                    }
                }))
            };
            let toml = format!(
                "[tools.pay]\nkind = \"mutating\"\nretry = {{ max_attempts = 1 }}\n\
                 idempotency = {{ lease = \"6s\", record_retry = \"500ms\", \
                 on_store_error = \"{on_store_error}\", wait_timeout = \"20s\" }}\n"
            );
            let (shield, r) = replica(&server.url(), &prefix, &toml, tool.clone()).await;

            let first = tokio::spawn({
                let r = r.clone();
                async move { r.oneshot(mutation("pay", 5, "k")).await }
            });
            let started = std::time::Instant::now();
            while calls.load(Ordering::SeqCst) == 0 {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "{policy}: the claim"
                );
                sleep(Duration::from_millis(5)).await;
            }
            // The claim is on the server (persisted); Redis goes away, or stops answering.
            if fault == "kill" {
                server.kill();
            } else {
                server.pause();
            }
            let _ = go.send(true);
            let answer = first.await.unwrap().expect("the tool's answer is returned");
            assert_eq!(answer.output, json!({ "charge": 1 }));
            assert!(answer.provenance.unrecorded, "{policy}: the caller is told");

            // Redis is back, with the claim, well within its lease.
            if fault == "kill" {
                server.restart().expect("restart");
            } else {
                server.resume();
            }
            let dup = {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                loop {
                    match r.clone().oneshot(mutation("pay", 5, "k")).await {
                        Err(e) if e.kind() == ErrorKind::StoreUnavailable => {
                            assert!(std::time::Instant::now() < deadline, "{policy}: reconnect");
                            sleep(Duration::from_millis(50)).await;
                        }
                        other => break other,
                    }
                }
            };
            assert_eq!(
                calls.load(Ordering::SeqCst),
                1,
                "{policy}: the duplicate ran the mutation again: {dup:?}"
            );
            match dup {
                Ok(resp) => {
                    assert!(resp.provenance.replayed, "{policy}: {resp:?}");
                    assert_eq!(resp.output, answer.output);
                }
                Err(e) => assert!(
                    matches!(e.kind(), ErrorKind::OutcomeUnknown | ErrorKind::InProgress),
                    "{policy}: {e}"
                ),
            }
            let rec = shield
                .idempotency("pay")
                .record_for(&mutation("pay", 5, "k"))
                .await
                .unwrap();
            assert!(
                rec.as_ref()
                    .is_some_and(|r| r.status != RecordStatus::Pending),
                "{policy}: the outcome is recorded once Redis is back: {rec:?}"
            );
        }
    }
}

/// Tool Reliability Layer contract: a replay reaches the edge as the response envelope with
/// `fromCache = true` under its documented JSON names.
#[tokio::test(start_paused = true)]
async fn a_replayed_result_serialises_as_the_specified_envelope() {
    let calls = counter();
    let shield = Shield::from_config(config(PAY)).expect("shield");
    let r = router(
        &shield,
        vec![("pay", scripted(&calls, |n| async move { charge(n) }))],
    );
    r.clone().oneshot(mutation("pay", 5, "k")).await.unwrap();
    let replay = r.clone().oneshot(mutation("pay", 5, "k")).await;
    let v: Value = serde_json::to_value(ToolResult::from(replay)).unwrap();
    assert_eq!(v["status"], "success");
    assert_eq!(v["fromCache"], true);
    assert_eq!(v["data"], json!({ "charge": 1 }));
    assert!(v["durationMs"].is_number());
}
