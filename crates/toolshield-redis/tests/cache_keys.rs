//! The cache layer over `RedisCacheStore`: entries live under the one injective key
//! encoding, so no tool name or caller id reaches another caller's entry across processes.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_cache::{storage_key, CacheConfig, CacheLayer, CacheStore};
use toolshield_core::{CallKind, ToolRequest};
use toolshield_redis::testing::test_redis;
use toolshield_redis::RedisCacheStore;
use tower::{Layer, ServiceExt};

#[tokio::test]
async fn tool_and_caller_pairs_that_spelled_one_key_do_not_share_a_redis_entry() {
    let Some(redis) =
        test_redis("tool_and_caller_pairs_that_spelled_one_key_do_not_share_a_redis_entry")
    else {
        return;
    };
    let conn = common::connect(&redis.url(), &common::prefix(), Duration::from_secs(1)).await;
    let store = Arc::new(RedisCacheStore::new(conn));
    let layer = CacheLayer::with_store(
        CacheConfig {
            ttl: Duration::from_secs(60),
            per_user: true,
            ..CacheConfig::default()
        },
        store.clone(),
    )
    .expect("valid config");
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = common::counting_tool(Arc::clone(&runs), "tool", Duration::ZERO);
    let payload = json!({"account": "me"});
    let first = ToolRequest::new("a", payload.clone())
        .kind(CallKind::ReadOnly)
        .caller("b}:c");
    let second = ToolRequest::new("a}:b", payload)
        .kind(CallKind::ReadOnly)
        .caller("c");

    let one = layer
        .layer(tool.clone())
        .oneshot(first.clone())
        .await
        .expect("first");
    let two = layer
        .layer(tool.clone())
        .oneshot(second.clone())
        .await
        .expect("second");
    assert!(
        !two.provenance.cache_hit,
        "not served the other caller's entry"
    );
    assert_ne!(one.output, two.output);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // Each entry is under its own encoded key, and the old shared spelling holds nothing.
    let digest = first.payload_digest().expect("digest");
    let a = storage_key("a", Some("b}:c"), &digest);
    let b = storage_key("a}:b", Some("c"), &digest);
    assert_eq!(a, format!("cache:{{a}}:s4:b}}:c:{digest}"));
    assert_eq!(b, format!("cache:{{a%7D:b}}:s1:c:{digest}"));
    let found = |k: String| {
        let store = store.clone();
        async move { store.get(&k).await.expect("get").map(|l| l.response.output) }
    };
    assert_eq!(found(a).await, Some(one.output));
    assert_eq!(found(b).await, Some(two.output));
    assert_eq!(found(format!("cache:{{a}}:b}}:c/{digest}")).await, None);
}
