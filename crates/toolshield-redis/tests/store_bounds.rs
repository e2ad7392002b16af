//! Bounds of the cache, budget, rate-limit and shared-breaker stores: durations at the
//! edge of what a configuration or a hand-built call can carry, counters at the edge of
//! what Redis holds, and hashes that must not keep what has expired.

mod common;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use common::{connect, prefix};
use serde_json::json;
use tokio::time::Instant;
use toolshield_breaker::{BreakerConfig, BreakerRegistry, CircuitState};
use toolshield_budget::{BudgetStore, Charge, Verdict};
use toolshield_cache::CacheStore;
use toolshield_core::config::MAX_DURATION;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{Decision, MemoryRateLimitStore, RateLimit, RateLimitStore};
use toolshield_redis::testing::test_redis;
use toolshield_redis::{
    budget_key, RedisBudgetStore, RedisCacheStore, RedisConnection, RedisRateLimitStore,
    SharedBreakerState,
};
use tower::{service_fn, Layer, ServiceExt};

/// A plain client on the test Redis, to look at what the stores wrote.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

fn charge<'a>(key: &'a str, cost: u64, ttl: Duration) -> Charge<'a> {
    Charge {
        key,
        tool: "search",
        max_calls: None,
        cost,
        run_max_calls: None,
        run_max_cost: None,
        ttl,
    }
}

#[tokio::test]
async fn a_cache_entry_written_with_the_longest_ttl_is_kept_and_still_expires() {
    let Some(redis) =
        test_redis("a_cache_entry_written_with_the_longest_ttl_is_kept_and_still_expires")
    else {
        return;
    };
    let prefix = prefix();
    let conn = connect(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let store = RedisCacheStore::new(conn);
    let key = "cache:{search}:-:abc";
    store
        .put(key, ToolResponse::new(json!({"hits": 1})), Duration::MAX)
        .await
        .expect("a TTL past the clock's range is bounded, not refused");
    let found = store.get(key).await.unwrap().expect("the entry");
    assert_eq!(found.response.output, json!({"hits": 1}));
    assert!(found.ttl_left <= MAX_DURATION, "{:?}", found.ttl_left);
    let mut r = raw(&redis.url()).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(format!("{prefix}{key}"))
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(pttl > 0, "every key written has a TTL, got {pttl}");
}

#[tokio::test]
async fn a_budget_charge_with_the_longest_ttl_is_counted_and_still_expires() {
    let Some(redis) =
        test_redis("a_budget_charge_with_the_longest_ttl_is_counted_and_still_expires")
    else {
        return;
    };
    let prefix = prefix();
    let conn = connect(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let store = RedisBudgetStore::new(conn);
    let verdict = store
        .charge(charge("r:run-1", 0, Duration::MAX))
        .await
        .expect("a TTL past the clock's range is bounded, not refused");
    assert_eq!(verdict, Verdict::Admitted);
    let mut r = raw(&redis.url()).await;
    let full = format!("{prefix}{}", budget_key("r:run-1"));
    let (calls, pttl): (Option<i64>, i64) = redis::pipe()
        .cmd("HGET")
        .arg(&full)
        .arg("#calls")
        .cmd("PTTL")
        .arg(&full)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(calls, Some(1));
    assert!(pttl > 0, "every key written has a TTL, got {pttl}");
}

#[tokio::test]
async fn a_budget_charge_counts_every_counter_or_none_even_at_the_largest_cost() {
    let Some(redis) =
        test_redis("a_budget_charge_counts_every_counter_or_none_even_at_the_largest_cost")
    else {
        return;
    };
    let prefix = prefix();
    let conn = connect(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let store = RedisBudgetStore::new(conn);
    let ttl = Duration::from_secs(60);
    let mut admitted = 0;
    // Costs a hand-built charge can carry: past 2^53, and past what Redis can add up.
    for cost in [u64::MAX, 1 << 60, 5, u64::MAX] {
        match store.charge(charge("r:costly", cost, ttl)).await {
            Ok(Verdict::Admitted) => admitted += 1,
            Ok(other) => panic!("no limit is set, got {other:?}"),
            Err(_) => {}
        }
    }
    let mut r = raw(&redis.url()).await;
    let full = format!("{prefix}{}", budget_key("r:costly"));
    let (tool, calls): (Option<i64>, Option<i64>) = redis::pipe()
        .cmd("HGET")
        .arg(&full)
        .arg("t:search")
        .cmd("HGET")
        .arg(&full)
        .arg("#calls")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        (tool.unwrap_or(0), calls.unwrap_or(0)),
        (admitted, admitted),
        "a charge that was not admitted must not count a call"
    );
    assert_eq!(admitted, 4, "no limit is set: every charge is admitted");
}

#[tokio::test]
async fn a_shared_rate_limit_admits_the_burst_a_local_one_admits() {
    let Some(redis) = test_redis("a_shared_rate_limit_admits_the_burst_a_local_one_admits") else {
        return;
    };
    let conn: RedisConnection = connect(&redis.url(), &prefix(), Duration::from_secs(1)).await;
    let shared = RedisRateLimitStore::new(conn, "search");
    let local = MemoryRateLimitStore::new(10);
    // A burst whose tolerance is longer than the longest duration: the limit bounds it.
    let limit = RateLimit::new(1, MAX_DURATION, 5);
    let admitted = |d: Decision| matches!(d, Decision::Admit { wait, .. } if wait.is_zero());
    let (mut n_shared, mut n_local) = (0, 0);
    for _ in 0..5 {
        n_shared += usize::from(admitted(
            shared
                .acquire(Some("k"), &limit, Duration::ZERO)
                .await
                .unwrap(),
        ));
        n_local += usize::from(admitted(
            local
                .acquire(Some("k"), &limit, Duration::ZERO)
                .await
                .unwrap(),
        ));
    }
    assert_eq!(n_shared, n_local, "one limit, wherever it is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_openings_do_not_accumulate_in_the_shared_breaker_hash() {
    let Some(redis) = test_redis("expired_openings_do_not_accumulate_in_the_shared_breaker_hash")
    else {
        return;
    };
    let prefix = prefix();
    let conn = connect(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let open_wait = Duration::from_millis(150);
    let registry = BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 1,
        open_wait,
        ..BreakerConfig::default()
    })
    .unwrap();
    let _shared = SharedBreakerState::attach(&registry, conn, "fleet")
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = service_fn(move |_req: ToolRequest| {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down")) }
    });
    let svc = toolshield_breaker::BreakerLayer::new(registry.clone()).layer(tool);
    let mut r = raw(&redis.url()).await;
    let hash = format!("{prefix}breaker:{{fleet}}");
    let keys = 12;
    for i in 0..keys {
        let tool = format!("tool-{i}");
        let _ = svc
            .clone()
            .oneshot(ToolRequest::new(tool.as_str(), json!({})))
            .await;
        assert_eq!(registry.state(&tool), CircuitState::Open);
        // Wait until the opening is in the hash, then let time pass.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let there: bool = redis::cmd("HEXISTS")
                .arg(&hash)
                .arg(&tool)
                .query_async(&mut r)
                .await
                .unwrap();
            if there {
                break;
            }
            assert!(Instant::now() < deadline, "{tool} was never published");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (fields, pttl): (i64, i64) = redis::pipe()
        .cmd("HLEN")
        .arg(&hash)
        .cmd("PTTL")
        .arg(&hash)
        .query_async(&mut r)
        .await
        .unwrap();
    // Openings 50 ms or more apart, each open 150 ms: at most 4 can still be open.
    assert!(
        fields <= 4,
        "the hash keeps {fields} fields of {keys} openings: expired ones accumulate"
    );
    assert!(pttl > 0, "the hash has a TTL, got {pttl}");
}
