//! Faults against a real redis-server: killed and restarted, a paused owner whose lease
//! was taken over, a slow (stopped) Redis that hits the store timeout.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{call, config, connect, counting_tool, eventually, pay, prefix, stack};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{Digest, ErrorKind, ToolResponse};
use toolshield_idempotency::testing::FaultyStore;
use toolshield_idempotency::{
    ClaimOutcome, IdempotencyConfig, IdempotencyRecord, IdempotencyStore, OnStoreError,
    RecordStatus,
};
use toolshield_redis::testing::{private_persistent_redis, private_redis};
use toolshield_redis::RedisIdempotencyStore;

/// Short enough to keep the stalled-Redis test quick, long enough for a loaded CI machine.
const OP_TIMEOUT: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_runs_nothing_while_redis_is_down_and_recovers_after_restart() {
    let Some(mut redis) = private_persistent_redis(
        "fail_closed_runs_nothing_while_redis_is_down_and_recovers_after_restart",
    ) else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(RedisIdempotencyStore::new(conn.clone()));
    let (svc, handle) = stack(
        config(OnStoreError::FailClosed),
        store,
        counting_tool(Arc::clone(&runs), "a", Duration::ZERO),
    );

    let before = call(&svc, pay("before-outage")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    redis.kill();
    for i in 0..5 {
        let started = Instant::now();
        let err = call(&svc, pay(&format!("during-outage-{i}")))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::StoreUnavailable, "{err}");
        assert!(
            started.elapsed() < OP_TIMEOUT * 5,
            "a down redis must fail fast"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "nothing runs while the store is down"
    );
    assert!(handle.counts().store_errors >= 5);
    assert!(
        conn.health().await.is_err(),
        "health must report the outage"
    );

    // Same port, same append-only file: the record written before the outage is back.
    redis.restart().unwrap();
    let after = eventually(Duration::from_secs(10), "reconnection", || {
        let svc = svc.clone();
        async move { call(&svc, pay("after-restart")).await.ok() }
    })
    .await;
    assert!(!after.provenance.replayed);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "only the successful call after the restart ran"
    );
    assert!(conn.health().await.is_ok());

    let replay = call(&svc, pay("before-outage")).await.unwrap();
    assert!(
        replay.provenance.replayed,
        "a key completed before the outage must not run again"
    );
    assert_eq!(replay.output, before.output);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_past_its_lease_cannot_overwrite_the_taker() {
    let Some(redis) = private_redis("an_owner_paused_past_its_lease_cannot_overwrite_the_taker")
    else {
        return;
    };
    let prefix = prefix();
    // Longer than the operation timeout, as the layer requires.
    let lease = Duration::from_millis(600);
    let cfg = IdempotencyConfig {
        lease,
        ..IdempotencyConfig::default()
    };

    // Process A: its tool runs until released, and its renewals never answer (paused, as
    // a process stopped by a long GC pause or a `SIGSTOP` renews nothing).
    let pause = FaultPlan::new();
    pause.always("renew", Fault::Hang);
    let store_a = Arc::new(FaultyStore::new(
        Arc::new(RedisIdempotencyStore::new(
            connect(&redis.url(), &prefix, OP_TIMEOUT).await,
        )),
        pause.clone(),
    ));
    let runs = Arc::new(AtomicUsize::new(0));
    let (go, go_rx) = watch::channel(false);
    let runs_a = Arc::clone(&runs);
    let tool_a = tower::service_fn(move |_req| {
        let (runs, mut go) = (Arc::clone(&runs_a), go_rx.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let _ = go.wait_for(|g| *g).await;
            Ok::<_, toolshield_core::ToolError>(ToolResponse::new(json!({"by": "a"})))
        }
    });
    let (svc_a, _) = stack(cfg.clone(), store_a, tool_a);
    // An idempotent call: a mutation that cannot renew its lease gives up before it ends
    // (tested in the idempotency crate); an idempotent one runs on, and fencing alone must
    // keep its late result from overwriting the taker's.
    let paused = || pay("paused").kind(toolshield_core::CallKind::Idempotent);
    let a = tokio::spawn(async move { call(&svc_a, paused()).await });
    // A holds the claim and its tool is running.
    let runs_now = Arc::clone(&runs);
    eventually(Duration::from_secs(5), "A's claim", || {
        let n = runs_now.load(Ordering::SeqCst);
        async move { (n == 1).then_some(()) }
    })
    .await;

    // Process B.
    let conn_b = connect(&redis.url(), &prefix, OP_TIMEOUT).await;
    let store_b = Arc::new(RedisIdempotencyStore::new(conn_b.clone()));
    let (svc_b, handle_b) = stack(
        IdempotencyConfig {
            on_pending: toolshield_idempotency::OnPending::FailFast,
            ..cfg.clone()
        },
        store_b.clone(),
        counting_tool(Arc::clone(&runs), "b", Duration::ZERO),
    );
    // While A's lease lives, B is told IN_PROGRESS; once it lapsed, B takes the key over.
    let taken = eventually(Duration::from_secs(5), "takeover", || {
        let svc = svc_b.clone();
        async move {
            match call(&svc, paused()).await {
                Ok(resp) => Some(resp),
                Err(e) if e.kind() == ErrorKind::InProgress => None,
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
    })
    .await;
    assert_eq!(taken.output["by"], "b");
    assert_eq!(handle_b.counts().executions, 1);
    assert_eq!(handle_b.counts().takeovers, 1, "the takeover is counted");

    // A wakes up and finishes: its complete is fenced off.
    pause.clear();
    let _ = go.send(true);
    let a_resp = a.await.unwrap().unwrap();
    assert_eq!(
        a_resp.output["by"], "a",
        "A's caller still gets A's own result"
    );
    assert!(
        a_resp.provenance.unrecorded,
        "and is told it was not recorded"
    );
    let key = toolshield_idempotency::storage_key("pay", None, "paused");
    let rec = store_b.get(&key).await.unwrap().expect("B's record");
    assert_eq!(rec.status, RecordStatus::Completed);
    assert_eq!(
        rec.result.unwrap().output["by"],
        "b",
        "A must not overwrite B's record"
    );
    let replay = call(&svc_b, paused()).await.unwrap();
    assert!(replay.provenance.replayed);
    assert_eq!(replay.output["by"], "b");

    // The same at store level: a stale owner can neither complete, renew nor release.
    let k = "idemp:{pay}:store-level";
    let hash = Digest::of_bytes(b"p");
    let store_a = RedisIdempotencyStore::new(connect(&redis.url(), &prefix, OP_TIMEOUT).await);
    assert_eq!(
        store_a
            .claim(k, IdempotencyRecord::pending(hash, "a", lease), lease)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    eventually(Duration::from_secs(5), "lease expiry", || {
        let s = store_b.clone();
        async move {
            match s
                .claim(k, IdempotencyRecord::pending(hash, "b", lease), lease)
                .await
                .unwrap()
            {
                ClaimOutcome::TakenOver { .. } => Some(()),
                ClaimOutcome::Claimed => panic!("the expired claim must be reported as a takeover"),
                ClaimOutcome::Existing(_) => None,
            }
        }
    })
    .await;
    let b_done = IdempotencyRecord::completed(
        hash,
        "b",
        ToolResponse::new(json!("b")),
        Duration::from_secs(60),
    );
    assert!(store_b
        .finish(k, "b", b_done, Duration::from_secs(60))
        .await
        .unwrap());
    let a_done = IdempotencyRecord::completed(
        hash,
        "a",
        ToolResponse::new(json!("a")),
        Duration::from_secs(60),
    );
    assert!(!store_a
        .finish(k, "a", a_done, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(!store_a.renew(k, "a", lease).await.unwrap());
    assert!(!store_a.release(k, "a").await.unwrap());
    let rec = store_a.get(k).await.unwrap().unwrap();
    assert_eq!(rec.owner, "b");
    assert_eq!(rec.result.unwrap().output, json!("b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_hits_the_store_timeout_and_is_handled_as_configured() {
    let Some(redis) =
        private_redis("a_stopped_redis_hits_the_store_timeout_and_is_handled_as_configured")
    else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let store = Arc::new(RedisIdempotencyStore::new(conn.clone()));
    let runs = Arc::new(AtomicUsize::new(0));
    let (closed, _) = stack(
        config(OnStoreError::FailClosed),
        store.clone(),
        counting_tool(Arc::clone(&runs), "closed", Duration::ZERO),
    );
    let (open, _) = stack(
        config(OnStoreError::FailOpen),
        store.clone(),
        counting_tool(Arc::clone(&runs), "open", Duration::ZERO),
    );
    call(&closed, pay("warm")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Every script is cached on the server before it stops.
    store
        .release("idemp:{warm}:-:g:none", "nobody")
        .await
        .unwrap();

    redis.pause(); // SIGSTOP: the socket stays open, nothing answers
    let started = Instant::now();
    let err = call(&closed, pay("slow-closed")).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::StoreUnavailable, "{err}");
    assert!(
        took >= OP_TIMEOUT && took < OP_TIMEOUT * 4,
        "bounded by the store timeout: {took:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "fail-closed runs nothing");

    let resp = call(&open, pay("slow-open")).await.unwrap();
    assert_eq!(resp.output["by"], "open");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "fail-open runs the tool");

    let health = conn.health().await.unwrap_err();
    assert!(health.is_timeout(), "{health}");

    redis.resume();
    eventually(Duration::from_secs(10), "recovery", || {
        let conn = conn.clone();
        async move { conn.health().await.ok() }
    })
    .await;
    let replay = call(&closed, pay("warm")).await.unwrap();
    assert!(
        replay.provenance.replayed,
        "the record from before the stall is still there"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The claims that timed out were on the wire and landed when Redis resumed; the
    // release sent after each (by its owner token, on the same connection) landed after
    // it, so no key is left blocked as PENDING with no owner alive.
    for key in ["slow-closed", "slow-open"] {
        let skey = toolshield_idempotency::storage_key("pay", None, key);
        let left = store.get(&skey).await.unwrap();
        assert!(
            left.as_ref()
                .is_none_or(|r| r.status != RecordStatus::Pending),
            "{key} is blocked by a claim nobody owns: {left:?}"
        );
    }
    let retried = call(&closed, pay("slow-closed")).await.unwrap();
    assert_eq!(retried.output["by"], "closed", "the retry runs at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_over_a_stopped_or_killed_redis_runs_the_tool_within_the_store_timeout() {
    let test = "a_cache_over_a_stopped_or_killed_redis_runs_the_tool_within_the_store_timeout";
    let Some(mut redis) = private_redis(test) else {
        return;
    };
    const OP: Duration = Duration::from_millis(200);
    let conn = connect(&redis.url(), &prefix(), OP).await;
    let layer = toolshield_cache::CacheLayer::with_store(
        toolshield_cache::CacheConfig {
            ttl: Duration::from_secs(60),
            ..toolshield_cache::CacheConfig::default()
        },
        Arc::new(toolshield_redis::RedisCacheStore::new(conn.clone())),
    )
    .expect("valid config");
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = tower::Layer::layer(
        &layer,
        counting_tool(Arc::clone(&runs), "tool", Duration::ZERO),
    );
    let read = |city: &str| {
        toolshield_core::ToolRequest::new("weather", json!({ "city": city }))
            .kind(toolshield_core::CallKind::ReadOnly)
    };
    use tower::ServiceExt;
    svc.clone().oneshot(read("warm")).await.expect("warm");
    let hit = svc.clone().oneshot(read("warm")).await.expect("hit");
    assert!(hit.provenance.cache_hit);

    redis.pause();
    let started = Instant::now();
    let res = svc
        .clone()
        .oneshot(read("paused"))
        .await
        .expect("the tool answers");
    let took = started.elapsed();
    assert!(!res.provenance.cache_hit);
    // A lookup and a write-back, each bounded by the store timeout.
    assert!(took < OP * 4, "bounded by the store timeout: {took:?}");
    redis.resume();

    redis.kill();
    let started = Instant::now();
    let res = svc
        .clone()
        .oneshot(read("killed"))
        .await
        .expect("the tool answers");
    let took = started.elapsed();
    assert!(!res.provenance.cache_hit);
    assert!(took < OP * 4, "bounded by the store timeout: {took:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
