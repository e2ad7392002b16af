//! The shared rate limit against a real redis-server: one limit across two replicas,
//! the retry-after on the server's clock, waiting for a turn, cancelled waiters giving
//! theirs back, and a paused server failing open or closed as configured.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{connect, prefix};
use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{
    ByCaller, Decision, OnStoreError, RateLimit, RateLimitLayer, RateLimitStore,
};
use toolshield_redis::testing::{private_redis, test_redis};
use toolshield_redis::RedisRateLimitStore;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Stack = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

const OP_TIMEOUT: Duration = Duration::from_millis(400);

fn tool() -> Stack {
    BoxCloneService::new(service_fn(|_req: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
    }))
}

fn req() -> ToolRequest {
    ToolRequest::new("search", json!({}))
}

/// Asserts `got` is `want` less at most `elapsed` (the server's clock moved meanwhile),
/// to the microsecond.
fn assert_retry_after(got: Option<Duration>, want: Duration, elapsed: Duration) {
    let got = got.expect("a retry_after");
    assert!(
        got <= want && got + elapsed + Duration::from_micros(1) >= want,
        "retry_after {got:?}, want {want:?} less at most {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit() {
    let Some(redis) = test_redis("two_replicas_share_one_limit") else {
        return;
    };
    let p = prefix();
    let limit = RateLimit::new(3, Duration::from_secs(60), 3);
    // Two processes: each its own connection and store, one namespace.
    let replica = |conn| {
        RateLimitLayer::new(limit)
            .with_store(Arc::new(RedisRateLimitStore::new(conn, "search")))
            .keyed(ByCaller)
    };
    let a = replica(connect(&redis.url(), &p, OP_TIMEOUT).await);
    let b = replica(connect(&redis.url(), &p, OP_TIMEOUT).await);
    let (sa, sb) = (a.stats(), b.stats());
    let (a, b) = (a.layer(tool()), b.layer(tool()));
    let start = Instant::now();
    assert!(a.clone().oneshot(req().caller("alice")).await.is_ok());
    assert!(b.clone().oneshot(req().caller("alice")).await.is_ok());
    assert!(a.clone().oneshot(req().caller("alice")).await.is_ok());
    let err = b.clone().oneshot(req().caller("alice")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_retry_after(err.retry_after(), Duration::from_secs(20), start.elapsed());
    assert!(a.clone().oneshot(req().caller("alice")).await.is_err());
    // Another caller, and calls without one, have buckets of their own.
    assert!(b.clone().oneshot(req().caller("bob")).await.is_ok());
    assert!(b.clone().oneshot(req()).await.is_ok());
    assert_eq!((sa.snapshot().admitted, sb.snapshot().admitted), (2, 3));
    assert_eq!(sa.snapshot().rejected + sb.snapshot().rejected, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_after_is_the_time_to_the_next_conforming_call() {
    let Some(redis) = test_redis("the_retry_after_is_the_time_to_the_next_conforming_call") else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let store = RedisRateLimitStore::new(conn.clone(), "weather");
    let limit = RateLimit::new(2, Duration::from_secs(10), 2);
    let key = Some("k{1}|+x");
    let start = Instant::now();
    for _ in 0..2 {
        let d = store.acquire(key, &limit, Duration::ZERO).await.unwrap();
        assert!(
            matches!(d, Decision::Admit { wait, .. } if wait.is_zero()),
            "{d:?}"
        );
    }
    let Decision::Reject { retry_after } =
        store.acquire(key, &limit, Duration::ZERO).await.unwrap()
    else {
        panic!("the third call conforms");
    };
    assert_retry_after(Some(retry_after), Duration::from_secs(5), start.elapsed());
    // Waiting up to 6 s: admitted, with that wait reserved; the next one waits 5 s more.
    let Decision::Admit { wait, .. } = store
        .acquire(key, &limit, Duration::from_secs(6))
        .await
        .unwrap()
    else {
        panic!("a 5 s wait fits 6 s");
    };
    assert_retry_after(Some(wait), Duration::from_secs(5), start.elapsed());
    let Decision::Reject { retry_after } = store
        .acquire(key, &limit, Duration::from_secs(6))
        .await
        .unwrap()
    else {
        panic!("a 10 s wait does not fit 6 s");
    };
    assert_retry_after(Some(retry_after), Duration::from_secs(10), start.elapsed());
    // The key lives only until its time has passed: 15 s (two turns and one reserved).
    let ttl: i64 = redis_pttl(&conn, &store, key).await;
    assert!(ttl > 14_000 && ttl <= 15_001, "pttl {ttl}");
}

async fn redis_pttl(
    conn: &toolshield_redis::RedisConnection,
    store: &RedisRateLimitStore,
    key: Option<&str>,
) -> i64 {
    let full = format!("{}{}", conn.config().key_prefix, store.storage_key(key));
    let client = redis::Client::open(conn.config().url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("PTTL")
        .arg(full)
        .query_async(&mut c)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waits_its_turn_and_a_cancelled_waiter_gives_it_back() {
    let Some(redis) = test_redis("a_call_waits_its_turn_and_a_cancelled_waiter_gives_it_back")
    else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let layer = RateLimitLayer::new(RateLimit::new(1, Duration::from_millis(300), 1))
        .with_store(Arc::new(RedisRateLimitStore::new(conn, "search")))
        .wait_up_to(Duration::from_secs(2));
    let stats = layer.stats();
    let svc = layer.layer(tool());
    let start = Instant::now();
    assert!(svc.clone().oneshot(req()).await.is_ok());
    assert!(svc.clone().oneshot(req()).await.is_ok());
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(250), "waited {waited:?}");
    // A waiter cancelled: its turn is given back (in the background).
    let waiter = tokio::spawn(svc.clone().oneshot(req()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiter.abort();
    let _ = waiter.await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = Instant::now();
    assert!(svc.clone().oneshot(req()).await.is_ok());
    // Its turn (about 200 ms away), not the one after it (500 ms away).
    let second = before.elapsed();
    assert!(second < Duration::from_millis(400), "waited {second:?}");
    assert_eq!(stats.snapshot().waited, 3);
}

/// Only the last turn reserved is taken back on the server too: a turn in the middle of
/// the queue stays taken, so no newcomer shares a turn with the calls behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_last_turn_is_taken_back() {
    let Some(redis) = test_redis("only_the_last_turn_is_taken_back") else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let store = RedisRateLimitStore::new(conn, "search");
    let limit = RateLimit::new(1, Duration::from_secs(10), 1);
    let wait = Duration::from_secs(100);
    let key = Some("k");
    let mut turns = Vec::new();
    for _ in 0..3 {
        match store.acquire(key, &limit, wait).await.unwrap() {
            Decision::Admit { turn, .. } => turns.push(turn),
            d @ Decision::Reject { .. } => panic!("rejected: {d:?}"),
        }
    }
    let retry_after = |d: Decision| match d {
        Decision::Reject { retry_after } => retry_after,
        d @ Decision::Admit { .. } => panic!("admitted: {d:?}"),
    };
    // The middle turn: nothing moves (the next turn stays about 30 s away).
    store.refund(key, &limit, turns[1]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = retry_after(store.acquire(key, &limit, Duration::ZERO).await.unwrap());
    assert!(r > Duration::from_secs(29), "{r:?}");
    // The last turn: given back (about 20 s away).
    store.refund(key, &limit, turns[2]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = retry_after(store.acquire(key, &limit, Duration::ZERO).await.unwrap());
    assert!(
        r > Duration::from_secs(19) && r <= Duration::from_secs(20),
        "{r:?}"
    );
    // The same turn again: nothing more.
    store.refund(key, &limit, turns[2]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = retry_after(store.acquire(key, &limit, Duration::ZERO).await.unwrap());
    assert!(r > Duration::from_secs(19), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_fails_open_or_closed_as_configured() {
    let Some(redis) = private_redis("a_paused_redis_fails_open_or_closed_as_configured") else {
        return;
    };
    let p = prefix();
    let limit = RateLimit::new(1, Duration::from_secs(60), 1);
    let open = RateLimitLayer::new(limit).with_store(Arc::new(RedisRateLimitStore::new(
        connect(&redis.url(), &p, OP_TIMEOUT).await,
        "search",
    )));
    let closed = RateLimitLayer::new(limit)
        .with_store(Arc::new(RedisRateLimitStore::new(
            connect(&redis.url(), &p, OP_TIMEOUT).await,
            "other",
        )))
        .on_store_error(OnStoreError::Reject);
    let (so, sc) = (open.stats(), closed.stats());
    let (open, closed) = (open.layer(tool()), closed.layer(tool()));
    // Healthy: the limit holds.
    assert!(open.clone().oneshot(req()).await.is_ok());
    assert!(open.clone().oneshot(req()).await.is_err());

    redis.pause();
    let start = Instant::now();
    let r = open.clone().oneshot(req()).await;
    let closed_err = closed.clone().oneshot(req()).await.unwrap_err();
    redis.resume();
    assert!(r.is_ok(), "fail open lets the call through: {r:?}");
    assert_eq!(closed_err.kind(), ErrorKind::StoreUnavailable);
    assert!(
        start.elapsed() < OP_TIMEOUT * 4,
        "bounded by the op timeout"
    );
    assert_eq!(so.snapshot().store_errors, 1);
    assert_eq!(sc.snapshot().store_errors, 1);
    // Back: the state kept in Redis still holds, and the store answers again. (The
    // script sent while paused may have run after the resume and taken its turn: the
    // limit errs on the strict side, so the closed limiter is checked on a fresh key.)
    let err = open.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert!(closed
        .oneshot(ToolRequest::new("fetch", json!({})))
        .await
        .is_ok());
    assert_eq!(sc.snapshot().store_errors, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_works_on_a_cluster_whatever_the_key() {
    use toolshield_redis::testing::{private_cluster, unique_prefix, ClusterOptions};
    use toolshield_redis::{RedisConfig, RedisConnection};
    let test = "the_limit_works_on_a_cluster_whatever_the_key";
    let Some(cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let config = RedisConfig::cluster(cluster.seeds())
        .with_key_prefix(unique_prefix())
        .with_op_timeout(Duration::from_secs(1));
    let conn = match RedisConnection::connect(config).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to the test cluster: {e}"),
    };
    assert!(conn.is_cluster());
    let a = RedisRateLimitStore::new(conn.clone(), "search");
    let b = RedisRateLimitStore::new(conn, "search");
    let limit = RateLimit::new(1, Duration::from_secs(60), 1);
    // Keys on many slots, some with braces and separators of their own.
    for key in [
        Some("alice"),
        Some("}{"),
        Some("{x}"),
        Some("a|+b"),
        Some(""),
        None,
    ] {
        let first = a.acquire(key, &limit, Duration::ZERO).await.unwrap();
        assert!(
            matches!(first, Decision::Admit { wait, .. } if wait.is_zero()),
            "{key:?}: {first:?}"
        );
        let second = b.acquire(key, &limit, Duration::ZERO).await.unwrap();
        assert!(
            matches!(second, Decision::Reject { .. }),
            "{key:?}: {second:?}"
        );
    }
}

/// A caller id longer than 4 KiB is not stored as a Redis key: every such id shares one
/// overflow bucket (limited together, as in memory), and Redis holds no key that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_keys_past_the_bound_share_one_overflow_bucket() {
    let Some(redis) = test_redis("caller_keys_past_the_bound_share_one_overflow_bucket") else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, OP_TIMEOUT).await;
    let store = Arc::new(RedisRateLimitStore::new(conn, "search"));
    let layer = RateLimitLayer::new(RateLimit::new(2, Duration::from_secs(60), 2))
        .with_store(store)
        .keyed(ByCaller);
    let svc = layer.layer(tool());
    let long = |c: char| c.to_string().repeat(5_000);
    assert!(svc.clone().oneshot(req().caller(long('a'))).await.is_ok());
    assert!(svc.clone().oneshot(req().caller(long('b'))).await.is_ok());
    let err = svc
        .clone()
        .oneshot(req().caller(long('c')))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited, "{err:?}");
    // A caller with a short id still has a bucket of its own.
    assert!(svc.clone().oneshot(req().caller("alice")).await.is_ok());
    let client = redis::Client::open(redis.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{p}*"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|k| k.len() < 200), "{keys:?}");
}
