//! The cache store contract suite, run for the in-memory store, and its memory bound.

use serde_json::json;
use toolshield_cache::testing::contract;
use toolshield_cache::{CacheStore, InMemoryCacheStore, MemoryCacheConfig};
use toolshield_core::ToolResponse;

#[tokio::test(start_paused = true)]
async fn in_memory_store_passes_the_contract() {
    contract::run_all(InMemoryCacheStore::new).await;
}

#[tokio::test(start_paused = true)]
async fn in_memory_store_as_trait_object_passes_the_contract() {
    let store: Box<dyn CacheStore> = Box::new(InMemoryCacheStore::new());
    contract::put_then_get(&*store).await;
    contract::entries_expire(&*store).await;
}

#[test]
fn a_flood_of_a_million_keys_never_exceeds_the_bound() {
    let cfg = MemoryCacheConfig {
        max_entries: 1_000,
        max_bytes: 1_000_000,
    };
    let store = InMemoryCacheStore::with_config(&cfg).expect("valid");
    let resp = ToolResponse::new(json!({"temp": 21}));
    let ttl = std::time::Duration::from_secs(3600);
    for i in 0..1_000_000u32 {
        store.put_now(&format!("cache:{{flood}}:{i}"), resp.clone(), ttl);
        if i % 10_000 == 9_999 {
            store.run_pending_tasks();
            assert!(
                store.entry_count() <= cfg.max_entries,
                "entries {} > bound at {i}",
                store.entry_count()
            );
            assert!(
                store.weighted_size() <= cfg.max_bytes,
                "bytes {} > bound at {i}",
                store.weighted_size()
            );
        }
    }
    store.run_pending_tasks();
    assert!(store.entry_count() <= cfg.max_entries);
    assert!(store.entry_count() > 0);
}

#[test]
fn the_byte_bound_holds_for_large_entries() {
    let cfg = MemoryCacheConfig {
        max_entries: 10_000,
        max_bytes: 100_000,
    };
    let store = InMemoryCacheStore::with_config(&cfg).expect("valid");
    let big = ToolResponse::new(json!({"blob": "x".repeat(10_000)}));
    for i in 0..1_000 {
        store.put_now(
            &format!("k{i}"),
            big.clone(),
            std::time::Duration::from_secs(60),
        );
    }
    store.run_pending_tasks();
    assert!(store.weighted_size() <= cfg.max_bytes);
    assert!(
        store.entry_count() <= 10,
        "10 KB entries in a 100 KB budget: {}",
        store.entry_count()
    );
}

#[test]
fn bounds_are_validated() {
    let err = MemoryCacheConfig {
        max_entries: 0,
        max_bytes: 0,
    }
    .validate()
    .expect_err("invalid");
    assert_eq!(err.problems().len(), 2);
}
