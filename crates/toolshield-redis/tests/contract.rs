//! The cache and idempotency store contract suites, unchanged, against a real Redis.

use toolshield_redis::testing::{test_redis, unique_prefix};
use toolshield_redis::{RedisCacheStore, RedisConfig, RedisConnection, RedisIdempotencyStore};

async fn connect(url: String) -> RedisConnection {
    let config = RedisConfig::from_url(url)
        .with_key_prefix(unique_prefix())
        .with_op_timeout(std::time::Duration::from_secs(1));
    match RedisConnection::connect(config).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to the test redis: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_store_passes_the_contract_suite() {
    let Some(redis) = test_redis("idempotency_store_passes_the_contract_suite") else {
        return;
    };
    let conn = connect(redis.url()).await;
    toolshield_idempotency::testing::contract::run_all(|| RedisIdempotencyStore::new(conn.clone()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_store_passes_the_contract_suite() {
    let Some(redis) = test_redis("cache_store_passes_the_contract_suite") else {
        return;
    };
    let conn = connect(redis.url()).await;
    toolshield_cache::testing::contract::run_all(|| RedisCacheStore::new(conn.clone())).await;
}

#[tokio::test]
async fn a_replay_is_one_round_trip_and_a_first_execution_two() {
    use serde_json::json;
    use std::sync::Arc;
    use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
    use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer};
    use tower::{service_fn, Service, ServiceExt};

    let Some(redis) = test_redis("a_replay_is_one_round_trip_and_a_first_execution_two") else {
        return;
    };
    let conn = connect(redis.url()).await;
    let store = Arc::new(RedisIdempotencyStore::new(conn.clone()));
    let layer = match IdempotencyLayer::with_store(IdempotencyConfig::default(), store) {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    };
    let mut svc = tower::Layer::layer(
        &layer,
        service_fn(|_req: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!({"charge": "ch_1"})))
        }),
    );
    let req = ToolRequest::new("pay", json!({"amount": 1}))
        .kind(CallKind::Mutating)
        .idempotency_key("rt-1");
    // Warm the script cache (EVALSHA answered NOSCRIPT once on a fresh server).
    let warm = req.clone().idempotency_key("rt-warm");
    svc.ready().await.unwrap().call(warm).await.unwrap();

    let before = conn.round_trips();
    let first = svc.ready().await.unwrap().call(req.clone()).await.unwrap();
    assert_eq!(conn.round_trips() - before, 2, "claim + complete");
    let before = conn.round_trips();
    let again = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(
        conn.round_trips() - before,
        1,
        "one claim answers the replay"
    );
    assert!(again.provenance.replayed);
    assert_eq!(first.output, again.output);
}

#[tokio::test]
async fn health_pings_redis() {
    let Some(redis) = test_redis("health_pings_redis") else {
        return;
    };
    let conn = connect(redis.url()).await;
    let rtt = RedisIdempotencyStore::new(conn.clone())
        .health()
        .await
        .unwrap();
    assert!(rtt < conn.config().health_timeout);
    RedisCacheStore::new(conn).health().await.unwrap();
}

#[tokio::test]
async fn a_result_cached_by_one_process_is_a_hit_in_another() {
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use toolshield_cache::{CacheConfig, CacheLayer};
    use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
    use tower::{service_fn, Layer, ServiceExt};

    let Some(redis) = test_redis("a_result_cached_by_one_process_is_a_hit_in_another") else {
        return;
    };
    let prefix = unique_prefix();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut stacks = Vec::new();
    for _ in 0..2 {
        let config = RedisConfig::from_url(redis.url()).with_key_prefix(prefix.clone());
        let conn = RedisConnection::connect(config).await.unwrap();
        let layer = CacheLayer::with_store(
            CacheConfig::default().with_ttl(Duration::from_secs(60)),
            Arc::new(RedisCacheStore::new(conn)),
        )
        .unwrap();
        let runs = Arc::clone(&runs);
        stacks.push(layer.layer(service_fn(move |_req: ToolRequest| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ToolError>(ToolResponse::new(json!({"temp": 21}))) }
        })));
    }
    let req = || ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly);
    let first = stacks[0].clone().oneshot(req()).await.unwrap();
    let other = stacks[1].clone().oneshot(req()).await.unwrap();
    assert!(!first.provenance.cache_hit);
    assert!(
        other.provenance.cache_hit,
        "the other process must hit the shared entry"
    );
    assert_eq!(other.output, first.output);
    assert_eq!(other.provenance.fetched_at, first.provenance.fetched_at);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
