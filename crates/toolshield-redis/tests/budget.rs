//! Call budgets on a real redis-server: two replicas share one run's budget, concurrent
//! calls across both never exceed a limit, hostile run ids stay apart, and a paused or
//! killed Redis gives the configured behaviour.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{connect, prefix};
use serde_json::json;
use tokio::time::Instant;
use toolshield_budget::{
    BudgetKey, BudgetLayer, BudgetLedger, LedgerConfig, Limit, OnStoreError, Scope,
};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_redis::testing::{private_redis, test_redis};
use toolshield_redis::{budget_key, RedisBudgetStore, RedisConnection};
use tower::util::BoxCloneSyncService;
use tower::{service_fn, Layer, ServiceExt};

type Tool = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

const OP_TIMEOUT: Duration = Duration::from_millis(400);

/// One replica: its own connection, its own ledger on Redis, one tool counting its runs.
fn replica(
    conn: &RedisConnection,
    cfg: &LedgerConfig,
    tool: &str,
    max_calls: Option<u64>,
    cost: u64,
    runs: &Arc<AtomicUsize>,
) -> (BudgetLedger, Tool) {
    let store = Arc::new(RedisBudgetStore::new(conn.clone()));
    let ledger = BudgetLedger::with_store(cfg, store).unwrap();
    let runs = Arc::clone(runs);
    let svc = BudgetLayer::new(&ledger, tool, max_calls)
        .cost(cost)
        .layer(service_fn(move |_r: ToolRequest| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok::<_, ToolError>(ToolResponse::new(json!(true)))
            }
        }));
    (ledger, BoxCloneSyncService::new(svc))
}

fn req(tool: &str, run: &str) -> ToolRequest {
    ToolRequest::new(tool, json!({})).run_id(run)
}

async fn call(svc: &Tool, r: ToolRequest) -> Result<ToolResponse, ToolError> {
    svc.clone().oneshot(r).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_run_budget() {
    let Some(redis) = test_redis("two_replicas_share_one_run_budget") else {
        return;
    };
    let p = prefix();
    let a = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let b = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let cfg = LedgerConfig {
        run_max_calls: Some(5),
        run_max_cost: Some(8),
        ..LedgerConfig::default()
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let (_la, search_a) = replica(&a, &cfg, "search", Some(3), 1, &runs);
    let (_lb, search_b) = replica(&b, &cfg, "search", Some(3), 1, &runs);
    let (_lb2, llm_b) = replica(&b, &cfg, "llm", None, 4, &runs);

    // The tool's limit spans both replicas.
    assert!(call(&search_a, req("search", "r1")).await.is_ok());
    assert!(call(&search_b, req("search", "r1")).await.is_ok());
    assert!(call(&search_a, req("search", "r1")).await.is_ok());
    let e = call(&search_b, req("search", "r1")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
    assert!(e.message().contains("tool `search`"), "{}", e.message());
    assert!(!e.message().contains("r1"));
    // Cost: 3 spent by search, 4 by llm = 7 of 8; the next llm call (4) does not fit.
    assert!(call(&llm_b, req("llm", "r1")).await.is_ok());
    let e = call(&llm_b, req("llm", "r1")).await.unwrap_err();
    assert!(e.message().contains("8 cost units"), "{}", e.message());
    // Another run is untouched.
    assert!(call(&search_a, req("search", "r2")).await.is_ok());
    assert_eq!(runs.load(Ordering::SeqCst), 5);

    // Run totals across tools and replicas: r3 may make 5 calls in all.
    let (_l, fetch_a) = replica(&a, &cfg, "fetch", None, 0, &runs);
    let (_l, fetch_b) = replica(&b, &cfg, "fetch", None, 0, &runs);
    let mut ok = 0;
    for i in 0..10 {
        let svc = if i % 2 == 0 { &fetch_a } else { &fetch_b };
        if call(svc, req("fetch", "r3")).await.is_ok() {
            ok += 1;
        }
    }
    assert_eq!(ok, 5);
    let e = call(&search_a, req("search", "r3")).await.unwrap_err();
    assert!(
        e.message().contains("5 calls across tools"),
        "{}",
        e.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_calls_across_two_replicas_admit_exactly_ten() {
    let Some(redis) = test_redis("hundred_concurrent_calls_across_two_replicas_admit_exactly_ten")
    else {
        return;
    };
    let p = prefix();
    let a = connect(&redis.url(), &p, Duration::from_secs(5)).await;
    let b = connect(&redis.url(), &p, Duration::from_secs(5)).await;
    let cfg = LedgerConfig {
        run_max_calls: Some(10),
        ..LedgerConfig::default()
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let (la, ta) = replica(&a, &cfg, "t", Some(50), 0, &runs);
    let (lb, tb) = replica(&b, &cfg, "t", Some(50), 0, &runs);
    let gate = Arc::new(tokio::sync::Barrier::new(100));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let svc = if i % 2 == 0 { ta.clone() } else { tb.clone() };
        let gate = Arc::clone(&gate);
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            svc.oneshot(req("t", "hot-run")).await
        }));
    }
    let (mut ok, mut exhausted) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) if e.kind() == ErrorKind::BudgetExhausted => exhausted += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!((ok, exhausted), (10, 90));
    assert_eq!(runs.load(Ordering::SeqCst), 10);
    let admitted = la.stats()[0].admitted() + lb.stats()[0].admitted();
    let rejected =
        la.stats()[0].exhausted(Limit::RunCalls) + lb.stats()[0].exhausted(Limit::RunCalls);
    assert_eq!((admitted, rejected), (10, 90));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_call_and_the_ttl_is_refreshed() {
    let Some(redis) = test_redis("one_round_trip_per_call_and_the_ttl_is_refreshed") else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let cfg = LedgerConfig {
        run_ttl: Duration::from_secs(30),
        run_max_calls: Some(1),
        ..LedgerConfig::default()
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let (_l, t) = replica(&conn, &cfg, "t", None, 0, &runs);
    // The first charge on a fresh server also loads the script (EVALSHA, then EVAL).
    call(&t, req("t", "warm-up")).await.unwrap();
    let before = conn.round_trips();
    call(&t, req("t", "ttl-run")).await.unwrap();
    assert_eq!(conn.round_trips() - before, 1);
    let e = call(&t, req("t", "ttl-run")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
    assert_eq!(conn.round_trips() - before, 2);

    let client = redis::Client::open(redis.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let encoded = BudgetKey::new(Scope::Run, Some("ttl-run"), None)
        .unwrap()
        .encoded();
    let key = format!("{p}{}", budget_key(&encoded));
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > 25_000 && pttl <= 30_000, "pttl {pttl}");
    let calls: i64 = redis::cmd("HGET")
        .arg(&key)
        .arg("#calls")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(calls, 1, "the rejected call was not counted");
    // Shorten the TTL by hand: the next (rejected) call refreshes it.
    let _: () = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(1_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(call(&t, req("t", "ttl-run")).await.is_err());
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > 25_000, "pttl {pttl} not refreshed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_run_ids_get_their_own_escaped_keys() {
    let Some(redis) = test_redis("hostile_run_ids_get_their_own_escaped_keys") else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let cfg = LedgerConfig {
        run_max_calls: Some(1),
        ..LedgerConfig::default()
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let (_l, t) = replica(&conn, &cfg, "t", None, 0, &runs);
    let ids = [
        "a}b",
        "a{b",
        "{a}",
        "a\nb",
        "a\r\n*1\r\n",
        "%7D",
        "}",
        "%",
        "",
        "r:x",
    ];
    for id in ids {
        assert!(call(&t, req("t", id)).await.is_ok(), "{id:?}");
    }
    for id in ids {
        let e = call(&t, req("t", id)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BudgetExhausted, "{id:?}");
    }
    let long = "L".repeat(toolshield_budget::MAX_ID_LEN);
    assert!(call(&t, req("t", &long)).await.is_ok());
    assert!(call(&t, req("t", &long)).await.is_err());
    // Every key is one hash tag: the whole key between the first braces.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{p}*"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys.len(), ids.len() + 1, "{keys:?}");
    for k in keys {
        let tagged = k.strip_prefix(&p).unwrap();
        assert!(tagged.starts_with("{toolshield:budget:") && tagged.ends_with('}'));
        assert_eq!(tagged.matches('{').count(), 1, "{tagged:?}");
        assert_eq!(tagged.matches('}').count(), 1, "{tagged:?}");
        assert!(!tagged.chars().any(char::is_control), "{tagged:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_rejects_by_default_and_allows_when_configured() {
    let Some(redis) = private_redis("a_paused_redis_rejects_by_default_and_allows_when_configured")
    else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let closed = LedgerConfig {
        run_max_calls: Some(3),
        ..LedgerConfig::default()
    };
    let open = LedgerConfig {
        on_store_error: OnStoreError::Allow,
        ..closed.clone()
    };
    let (lc, strict) = replica(&conn, &closed, "t", None, 0, &runs);
    let (lo, lenient) = replica(&conn, &open, "t", None, 0, &runs);
    assert!(call(&strict, req("t", "r")).await.is_ok());

    redis.pause();
    let started = Instant::now();
    let e = call(&strict, req("t", "r")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreUnavailable);
    assert!(
        started.elapsed() < OP_TIMEOUT * 4,
        "bounded by the op timeout"
    );
    for _ in 0..3 {
        assert!(call(&lenient, req("t", "r")).await.is_ok());
    }
    redis.resume();
    assert_eq!(lc.stats()[0].store_errors(), 1);
    assert_eq!(lo.stats()[0].store_errors(), 3);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "1 counted + 3 allowed uncounted"
    );
    // The charges that timed out were still sent: Redis applies them once it runs again
    // (a timed-out charge may count without its call running). Whatever the timing, the
    // store never counts past the limit.
    let mut ok_after = 0;
    for _ in 0..3 {
        if call(&strict, req("t", "r")).await.is_ok() {
            ok_after += 1;
        }
    }
    let client = redis::Client::open(redis.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let encoded = BudgetKey::new(Scope::Run, Some("r"), None)
        .unwrap()
        .encoded();
    let calls: i64 = redis::cmd("HGET")
        .arg(format!("{p}{}", budget_key(&encoded)))
        .arg("#calls")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(calls, 3, "the run's counter is at its limit, never past it");
    assert!(ok_after <= 2, "{ok_after} admitted after the pause");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_closed() {
    let Some(mut redis) = private_redis("a_killed_redis_fails_closed") else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let (_l, t) = replica(&conn, &LedgerConfig::default(), "t", Some(5), 0, &runs);
    assert!(call(&t, req("t", "r")).await.is_ok());
    redis.kill();
    for _ in 0..3 {
        let e = call(&t, req("t", "r")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::StoreUnavailable);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "nothing ran while Redis was down"
    );
}
