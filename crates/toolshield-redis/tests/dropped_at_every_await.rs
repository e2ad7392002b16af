//! Calls through the budget, rate-limit and cache layers over a real redis-server,
//! dropped at every `.await` they pass through (driven for exactly N polls, then dropped,
//! for every N until a call finishes within N polls): a budget charge is applied once or
//! not at all, never without the call having been admitted, and concurrent drops never
//! pass a limit; a waiter dropped once its turn is known gives the turn back; a cache
//! leader dropped anywhere leaves its followers answered, no flight open, and no entry
//! but a whole one of a tool run that finished.
//!
//! On real time, not tokio's paused clock: the server answers on its own clock, and a
//! command sent before its future was dropped can only be waited for (`LAND`), not
//! awaited; no assertion depends on how long anything took.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, prefix};
use serde_json::{json, Value};
use tokio::time::{sleep, timeout};
use toolshield_budget::{BudgetKey, BudgetLayer, BudgetLedger, LedgerConfig, Scope};
use toolshield_cache::{storage_key, CacheConfig, CacheLayer, CacheStore};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{Decision, RateLimit, RateLimitLayer, RateLimitStore};
use toolshield_redis::testing::test_redis;
use toolshield_redis::{budget_key, RedisBudgetStore, RedisCacheStore, RedisRateLimitStore};
use toolshield_test::Rng;
use toolshield_test::{drive, Driven};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// The most polls any call here needs; past it, a call that never finishes is a failure.
const MAX_POLLS: usize = 64;
/// Long enough for a command already sent, or a refund sent in the background, to land.
const LAND: Duration = Duration::from_millis(300);

async fn ready_call(
    svc: &Svc,
    req: ToolRequest,
) -> impl std::future::Future<Output = Result<ToolResponse, ToolError>> {
    let mut svc = svc.clone();
    svc.ready().await.expect("ready");
    svc.call(req)
}

/// A budgeted tool taking 50 ms, counting its runs.
fn budgeted(ledger: &BudgetLedger, max_calls: Option<u64>, runs: &Arc<AtomicUsize>) -> Svc {
    let runs = Arc::clone(runs);
    BoxCloneService::new(
        BudgetLayer::new(ledger, "search", max_calls).layer(service_fn(move |_r: ToolRequest| {
            runs.fetch_add(1, Ordering::SeqCst);
            async {
                sleep(Duration::from_millis(50)).await;
                Ok::<_, ToolError>(ToolResponse::new(json!(true)))
            }
        })),
    )
}

/// The run's calls counted in Redis.
async fn charged(raw: &mut redis::aio::MultiplexedConnection, p: &str, run: &str) -> i64 {
    let encoded = BudgetKey::new(Scope::Run, Some(run), None)
        .expect("key")
        .encoded();
    let calls: Option<i64> = redis::cmd("HGET")
        .arg(format!("{p}{}", budget_key(&encoded)))
        .arg("#calls")
        .query_async(raw)
        .await
        .expect("HGET");
    calls.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budgeted_call_dropped_at_any_await_is_charged_once_or_not_at_all_on_redis() {
    let Some(redis) =
        test_redis("a_budgeted_call_dropped_at_any_await_is_charged_once_or_not_at_all_on_redis")
    else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let client = redis::Client::open(redis.url()).expect("client");
    let mut raw = client
        .get_multiplexed_async_connection()
        .await
        .expect("raw");
    let cfg = LedgerConfig {
        run_max_calls: Some(10),
        ..LedgerConfig::default()
    };
    let ledger =
        BudgetLedger::with_store(&cfg, Arc::new(RedisBudgetStore::new(conn))).expect("valid");
    for n in 0..=MAX_POLLS {
        let run = format!("run-{n}");
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = budgeted(&ledger, Some(3), &runs);
        let req = || ToolRequest::new("search", json!({})).run_id(run.as_str());
        let driven = drive(ready_call(&svc, req()).await, n).await;
        sleep(LAND).await;
        let calls = charged(&mut raw, &p, &run).await;
        let ran = runs.load(Ordering::SeqCst);
        assert!(
            calls == 0 || calls == 1,
            "{n} polls: {calls} charges for one call"
        );
        assert!(ran <= 1, "{n} polls");
        if ran == 1 || driven.finished() {
            assert_eq!(
                (calls, ran),
                (1, 1),
                "{n} polls: the call ran uncharged or did not run"
            );
        }
        // What is left of the tool's budget is exactly what the charge left.
        for i in 0..(3 - calls) {
            let out = svc.clone().oneshot(req()).await;
            assert!(
                out.is_ok(),
                "{n} polls: call {i} after the drop refused: {out:?}"
            );
        }
        let over = svc.clone().oneshot(req()).await;
        assert!(
            matches!(&over, Err(e) if e.kind() == ErrorKind::BudgetExhausted),
            "{n} polls: {over:?}"
        );
        if driven.finished() {
            return;
        }
    }
    panic!("a budgeted call never finished within {MAX_POLLS} polls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgeted_calls_dropped_at_random_awaits_never_pass_the_limit_on_redis() {
    let Some(redis) =
        test_redis("budgeted_calls_dropped_at_random_awaits_never_pass_the_limit_on_redis")
    else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let client = redis::Client::open(redis.url()).expect("client");
    let mut raw = client
        .get_multiplexed_async_connection()
        .await
        .expect("raw");
    for seed in 1..=8u64 {
        let mut rng = Rng::new(seed);
        let limit = 1 + rng.below(6);
        let cfg = LedgerConfig {
            run_max_calls: Some(limit),
            ..LedgerConfig::default()
        };
        let ledger = BudgetLedger::with_store(&cfg, Arc::new(RedisBudgetStore::new(conn.clone())))
            .expect("valid");
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = budgeted(&ledger, None, &runs);
        let run = format!("seed-{seed}");
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let fut = ready_call(
                &svc,
                ToolRequest::new("search", json!({})).run_id(run.as_str()),
            )
            .await;
            let polls = usize::try_from(rng.below(6)).expect("small");
            tasks.spawn(drive(fut, polls));
        }
        let mut ok = 0;
        while let Some(t) = tasks.join_next().await {
            if let Driven::Finished(Ok(_)) = t.expect("task") {
                ok += 1;
            }
        }
        sleep(LAND).await;
        let calls = charged(&mut raw, &p, &run).await;
        let ran = runs.load(Ordering::SeqCst) as i64;
        assert!(
            calls <= limit as i64,
            "seed {seed}: {calls} charged, limit {limit}"
        );
        assert!(
            ran <= calls && ok <= calls,
            "seed {seed}: ran {ran}, answered {ok}, charged {calls}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_waiter_dropped_at_any_await_gives_its_known_turn_back_on_redis() {
    let Some(redis) =
        test_redis("a_rate_limited_waiter_dropped_at_any_await_gives_its_known_turn_back_on_redis")
    else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let limit = RateLimit::new(1, Duration::from_secs(2), 1);
    for n in 0..=MAX_POLLS {
        let store = Arc::new(RedisRateLimitStore::new(conn.clone(), &format!("drop-{n}")));
        let layer = RateLimitLayer::new(limit)
            .wait_up_to(Duration::from_secs(10))
            .with_store(store.clone());
        let stats = layer.stats();
        let started = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&started);
        let svc: Svc = BoxCloneService::new(layer.layer(service_fn(move |_r: ToolRequest| {
            seen.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ToolError>(ToolResponse::new(json!(true))) }
        })));
        let req = || ToolRequest::new("search", json!({}));
        // The first call takes the turn of now; the second waits 2 s for the next.
        let t0 = tokio::time::Instant::now();
        assert!(svc.clone().oneshot(req()).await.is_ok());
        let driven = drive(ready_call(&svc, req()).await, n).await;
        let waited = stats.snapshot().waited > 0;
        let ran = started.load(Ordering::SeqCst) == 2;
        sleep(LAND).await;
        let probe = store
            .acquire(Some("search"), &limit, Duration::from_secs(10))
            .await
            .expect("probe");
        let Decision::Admit { wait, .. } = probe else {
            panic!("{n} polls: the probe was refused: {probe:?}");
        };
        // When the probe's turn comes, from the first call: 2 s if the dropped call's turn
        // was given back, 4 s if it was kept (the server's clock and ours agree to well
        // under a second).
        let due = t0.elapsed() + wait;
        if ran {
            // The dropped call had its turn: the probe's is the one after.
            assert!(due > Duration::from_secs(3), "{n} polls: due at {due:?}");
        } else if waited {
            // Its turn was reserved and known, and never used: given back.
            assert!(
                due < Duration::from_secs(3),
                "{n} polls: a turn nobody used still holds the next caller: due at {due:?}"
            );
        }
        if driven.finished() {
            return;
        }
    }
    panic!("a waiting call never finished within {MAX_POLLS} polls");
}

fn cached_tool(started: &Arc<AtomicUsize>, ended: &Arc<Mutex<Vec<u64>>>) -> Svc {
    let (started, ended) = (Arc::clone(started), Arc::clone(ended));
    BoxCloneService::new(service_fn(move |_r: ToolRequest| {
        let n = started.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        let ended = Arc::clone(&ended);
        async move {
            sleep(Duration::from_millis(50)).await;
            ended.lock().expect("ended").push(n);
            Ok::<_, ToolError>(ToolResponse::new(json!({ "n": n })))
        }
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_leader_dropped_at_any_await_leaves_followers_answered_and_no_partial_entry_on_redis(
) {
    let Some(redis) = test_redis("a_cache_leader_dropped_at_any_await_leaves_followers_answered_and_no_partial_entry_on_redis") else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let store = Arc::new(RedisCacheStore::new(conn));
    let layer = CacheLayer::with_store(
        CacheConfig::default().with_ttl(Duration::from_secs(60)),
        store.clone(),
    )
    .expect("valid config");
    for n in 0..=MAX_POLLS {
        let req = || ToolRequest::new("weather", json!({ "city": n })).kind(CallKind::ReadOnly);
        let key = storage_key("weather", None, &req().payload_digest().expect("digest"));
        let started = Arc::new(AtomicUsize::new(0));
        let ended: Arc<Mutex<Vec<u64>>> = Arc::default();
        let svc = layer.layer(cached_tool(&started, &ended));
        let svc: Svc = BoxCloneService::new(svc);
        let leader = ready_call(&svc, req()).await;
        let follower = tokio::spawn(svc.clone().oneshot(req()));
        let driven = drive(leader, n).await;
        let followed = timeout(Duration::from_secs(10), follower)
            .await
            .unwrap_or_else(|_| panic!("{n} polls: the follower hangs"))
            .expect("follower task");
        let got: Value = followed
            .unwrap_or_else(|e| panic!("{n} polls: follower failed: {e}"))
            .output["n"]
            .clone();
        let finished_runs = ended.lock().expect("ended").clone();
        assert!(
            got.as_u64().is_some_and(|g| finished_runs.contains(&g)),
            "{n} polls: the follower got {got} of an unfinished run ({finished_runs:?})"
        );
        if driven.finished() {
            assert_eq!(started.load(Ordering::SeqCst), 1, "{n} polls: one flight");
        }
        sleep(LAND).await;
        // The entry, if any, is whole: one finished run's answer.
        if let Some(entry) = store.get(&key).await.expect("get") {
            let n_of = entry.response.output["n"].as_u64();
            assert!(
                n_of.is_some_and(|m| finished_runs.contains(&m)),
                "{n} polls: entry {:?}",
                entry.response.output
            );
        }
        // No flight is left open: the next call is answered.
        let next = timeout(Duration::from_secs(10), svc.clone().oneshot(req()))
            .await
            .unwrap_or_else(|_| panic!("{n} polls: the next call hangs"));
        assert!(next.is_ok(), "{n} polls: {next:?}");
        if driven.finished() {
            return;
        }
    }
    panic!("a cached call never finished within {MAX_POLLS} polls");
}
