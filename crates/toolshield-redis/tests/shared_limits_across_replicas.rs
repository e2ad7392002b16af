//! One rate limit and one run budget shared by two replicas (each its own connection and
//! its own limiter) through a real redis-server: replicas calling at once never put more
//! than the documented bound of calls into a period, and a Redis that dies and comes back
//! fails open or closed as configured while it is away and limits again once it is back.
//!
//! These run on real time, not tokio's paused clock: the limit is kept by the server,
//! against its own clock, so the callers must really spend the period (2.5 s of calls),
//! and a restarted server is waited for in short real pauses.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, prefix};
use serde_json::json;
use tokio::time::Instant;
use toolshield_budget::{BudgetLayer, BudgetLedger, LedgerConfig};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{OnStoreError, RateLimit, RateLimitLayer};
use toolshield_redis::testing::{private_redis, test_redis};
use toolshield_redis::{RedisBudgetStore, RedisRateLimitStore};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Stack = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

const OP_TIMEOUT: Duration = Duration::from_millis(400);

/// A tool that records when each call starts.
fn recording(starts: Arc<Mutex<Vec<Instant>>>) -> Stack {
    BoxCloneService::new(service_fn(move |_req: ToolRequest| {
        starts.lock().unwrap().push(Instant::now());
        async { Ok::<_, ToolError>(ToolResponse::new(json!("ok"))) }
    }))
}

fn req() -> ToolRequest {
    ToolRequest::new("search", json!({}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_calling_at_once_never_pass_the_rate_in_any_period() {
    let Some(redis) = test_redis("two_replicas_calling_at_once_never_pass_the_rate_in_any_period")
    else {
        return;
    };
    let p = prefix();
    let period = Duration::from_millis(500);
    // 5 per 500 ms without a burst: one call per 100 ms across both replicas.
    let limit = RateLimit::new(5, period, 1);
    let starts = Arc::new(Mutex::new(Vec::new()));
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let conn = connect(&redis.url(), &p, OP_TIMEOUT).await;
        let layer = RateLimitLayer::new(limit)
            .with_store(Arc::new(RedisRateLimitStore::new(conn, "search")))
            .on_store_error(OnStoreError::Reject);
        replicas.push((layer.stats(), layer.layer(recording(Arc::clone(&starts)))));
    }
    let begin = Instant::now();
    let run_for = Duration::from_millis(2_500);
    let mut tasks = Vec::new();
    for (_, svc) in &replicas {
        // Three callers per replica, each calling in a tight loop.
        for _ in 0..3 {
            let svc = svc.clone();
            tasks.push(tokio::spawn(async move {
                while begin.elapsed() < run_for {
                    match svc.clone().oneshot(req()).await {
                        Ok(_) => {}
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::RateLimited, "{e}");
                            tokio::task::yield_now().await;
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = begin.elapsed();
    let mut starts = starts.lock().unwrap().clone();
    starts.sort();
    let total = starts.len();
    // One per 100 ms on the server's clock, the first at once.
    let bound = 1 + (elapsed.as_millis() / 100) as usize;
    assert!(
        total <= bound,
        "{total} calls in {elapsed:?}, bound {bound}"
    );
    assert!(
        total >= 10,
        "the replicas were admitted at the rate: {total}"
    );
    let admitted: u64 = replicas.iter().map(|(s, _)| s.snapshot().admitted).sum();
    assert_eq!(admitted as usize, total);
    // By the replicas' own clock (a start is seen up to a round trip after the server
    // decided it): no window a little shorter than the period holds more than 5.
    let window = period - Duration::from_millis(40);
    for (i, t) in starts.iter().enumerate() {
        let n = starts[i..].iter().take_while(|s| **s < *t + window).count();
        assert!(n <= 5, "{n} calls within {window:?} from {:?}", *t - begin);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_dies_and_comes_back_fails_as_configured_then_limits_again() {
    let Some(mut redis) =
        private_redis("a_redis_that_dies_and_comes_back_fails_as_configured_then_limits_again")
    else {
        return;
    };
    let p = prefix();
    let limit = RateLimit::new(1, Duration::from_secs(60), 1);
    let replica = |conn, on| {
        RateLimitLayer::new(limit)
            .with_store(Arc::new(RedisRateLimitStore::new(conn, "search")))
            .on_store_error(on)
    };
    let open = replica(
        connect(&redis.url(), &p, OP_TIMEOUT).await,
        OnStoreError::Allow,
    );
    let closed = replica(
        connect(&redis.url(), &p, OP_TIMEOUT).await,
        OnStoreError::Reject,
    );
    let (so, sc) = (open.stats(), closed.stats());
    let ran = Arc::new(Mutex::new(Vec::new()));
    let open = open.layer(recording(Arc::clone(&ran)));
    let closed = closed.layer(recording(Arc::clone(&ran)));

    // Budgets too: fail closed by default.
    let budget_runs = Arc::new(AtomicUsize::new(0));
    let ledger = BudgetLedger::with_store(
        &LedgerConfig {
            run_max_calls: Some(2),
            ..LedgerConfig::default()
        },
        Arc::new(RedisBudgetStore::new(
            connect(&redis.url(), &p, OP_TIMEOUT).await,
        )),
    )
    .unwrap();
    let br = Arc::clone(&budget_runs);
    let budget = BudgetLayer::new(&ledger, "search", None).layer(service_fn(move |_r| {
        br.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, ToolError>(ToolResponse::new(json!("ok"))) }
    }));
    let run = || req().run_id("run-1");

    assert!(open.clone().oneshot(req()).await.is_ok());
    assert!(
        closed.clone().oneshot(req()).await.is_err(),
        "one shared limit"
    );
    assert!(budget.clone().oneshot(run()).await.is_ok());

    redis.kill();
    for _ in 0..2 {
        assert!(open.clone().oneshot(req()).await.is_ok(), "fail open");
        let e = closed.clone().oneshot(req()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::StoreUnavailable, "fail closed: {e}");
        let e = budget.clone().oneshot(run()).await.unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::StoreUnavailable,
            "budget fails closed: {e}"
        );
    }
    assert_eq!(ran.lock().unwrap().len(), 3, "only the fail-open calls ran");
    assert_eq!(budget_runs.load(Ordering::SeqCst), 1);
    assert_eq!(so.snapshot().store_errors, 2);
    assert_eq!(sc.snapshot().store_errors, 2);

    // Back (empty: its state was in memory): each replica reconnects, and the shared
    // limit holds again across them.
    redis.restart().expect("redis restarts");
    let back = Instant::now();
    let first = loop {
        match closed.clone().oneshot(req()).await {
            Err(e) if e.kind() == ErrorKind::StoreUnavailable => {
                assert!(
                    back.elapsed() < Duration::from_secs(10),
                    "the replica never reconnected: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    assert!(first.is_ok(), "the first call after the restart: {first:?}");
    let errors_before = so.snapshot().store_errors;
    let mut open_result = open.clone().oneshot(req()).await;
    while so.snapshot().store_errors > errors_before && back.elapsed() < Duration::from_secs(10) {
        // This replica is still reconnecting: it failed open. Try again.
        let before = so.snapshot().store_errors;
        open_result = open.clone().oneshot(req()).await;
        if so.snapshot().store_errors == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = open_result.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::RateLimited,
        "limited again across replicas: {e}"
    );
    // The budget's counters were lost with the server: the run starts afresh, and is
    // limited again from there.
    let mut ok = 0;
    let mut exhausted = 0;
    while exhausted < 2 {
        match budget.clone().oneshot(run()).await {
            Ok(_) => ok += 1,
            Err(e) if e.kind() == ErrorKind::StoreUnavailable => {
                // This replica's connection is still coming back.
                assert!(back.elapsed() < Duration::from_secs(10), "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::BudgetExhausted, "{e}");
                exhausted += 1;
            }
        }
    }
    assert_eq!(ok, 2, "the run's budget holds again after the restart");
}
