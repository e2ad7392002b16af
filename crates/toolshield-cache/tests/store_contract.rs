//! The cache store contract suite, run for the in-memory store, and its memory bound.

use serde_json::json;
use toolshield_cache::testing::contract;
use toolshield_cache::{CacheStore, InMemoryCacheStore, MemoryBounds};
use toolshield_core::ToolResponse;

/// A store with these bounds, and the bounds.
fn bounded(max_entries: u64, max_bytes: u64) -> (MemoryBounds, InMemoryCacheStore) {
    let cfg = MemoryBounds {
        max_entries,
        max_bytes,
    };
    let store = InMemoryCacheStore::with_config(&cfg).expect("valid");
    (cfg, store)
}

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
    let (cfg, store) = bounded(1_000, 1_000_000);
    let resp = ToolResponse::new(json!({"temp": 21}));
    let ttl = std::time::Duration::from_secs(3600);
    for i in 0..1_000_000u32 {
        store.put_now(&format!("cache:{{flood}}:{i}"), resp.clone(), ttl);
        if i % 10_000 == 9_999 {
            assert!(
                store.entries().len() <= cfg.max_entries,
                "entries {} > bound at {i}",
                store.entries().len()
            );
            assert!(
                store.entries().weighted_size() <= cfg.max_bytes,
                "bytes {} > bound at {i}",
                store.entries().weighted_size()
            );
        }
    }
    assert!(store.entries().len() <= cfg.max_entries);
    assert!(!store.entries().is_empty());
}

#[test]
fn the_byte_bound_holds_for_large_entries() {
    let (cfg, store) = bounded(10_000, 100_000);
    let big = ToolResponse::new(json!({"blob": "x".repeat(10_000)}));
    for i in 0..1_000 {
        store.put_now(
            &format!("k{i}"),
            big.clone(),
            std::time::Duration::from_secs(60),
        );
    }
    assert!(store.entries().weighted_size() <= cfg.max_bytes);
    assert!(
        store.entries().len() <= 10,
        "10 KB entries in a 100 KB budget: {}",
        store.entries().len()
    );
}

#[test]
fn entries_read_once_per_turn_survive_a_flood_of_one_off_keys() {
    let (cfg, store) = bounded(1_600, 100_000_000);
    let resp = ToolResponse::new(json!({"temp": 21}));
    let ttl = std::time::Duration::from_secs(3600);
    let hot: Vec<String> = (0..50).map(|i| format!("hot:{i}")).collect();
    for key in &hot {
        store.put_now(key, resp.clone(), ttl);
    }
    // 100,000 one-off keys, the hot set read after every 100 (far less than a turn of
    // any shard's clock).
    for i in 0..100_000u32 {
        store.put_now(&format!("once:{i}"), resp.clone(), ttl);
        if i % 100 == 99 {
            for key in &hot {
                assert!(store.get_now(key).is_some(), "{key} evicted at {i}");
            }
        }
    }
    assert!(store.entries().len() <= cfg.max_entries);
    // Without reads, the same keys would have gone long ago.
    assert!(store.get_now("once:0").is_none());
}

#[test]
fn an_entry_larger_than_its_share_is_not_stored_and_replaces_nothing() {
    let (_, store) = bounded(16, 16_000);
    let ttl = std::time::Duration::from_secs(60);
    store.put_now("k", ToolResponse::new(json!(1)), ttl);
    assert!(store.get_now("k").is_some());
    // Each of the 16 shards holds 1,000 bytes: a 5,000-byte response does not fit.
    store.put_now("k", ToolResponse::new(json!("x".repeat(5_000))), ttl);
    assert!(
        store.get_now("k").is_none(),
        "the older response is not served in place of the newer one"
    );
    assert_eq!(store.entries().len(), 0);
    assert_eq!(store.entries().weighted_size(), 0);
}

#[tokio::test(start_paused = true)]
async fn expired_entries_are_freed_by_a_read_or_a_purge() {
    let store = InMemoryCacheStore::new();
    let resp = ToolResponse::new(json!({"temp": 21}));
    store.put_now("a", resp.clone(), std::time::Duration::from_secs(10));
    store.put_now("b", resp.clone(), std::time::Duration::from_secs(10));
    store.put_now("c", resp, std::time::Duration::from_secs(60));
    tokio::time::advance(std::time::Duration::from_secs(11)).await;
    assert_eq!(
        store.entries().len(),
        3,
        "nothing is freed before it is looked at"
    );
    assert!(store.get_now("a").is_none());
    assert_eq!(store.entries().len(), 2, "the expired entry read is freed");
    store.entries().purge_expired();
    assert_eq!(
        store.entries().len(),
        1,
        "the purge frees the other expired entry"
    );
    assert!(store.get_now("c").is_some());
}

#[test]
fn bounds_are_validated() {
    let err = MemoryBounds {
        max_entries: 0,
        max_bytes: 0,
    }
    .validate()
    .expect_err("invalid");
    assert_eq!(err.problems().len(), 2);
}

#[test]
fn bounds_hold_under_concurrent_writers_readers_and_removers() {
    let (cfg, store) = bounded(500, 200_000);
    let ttl = std::time::Duration::from_secs(3600);
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let store = store.clone();
            scope.spawn(move || {
                for i in 0..20_000u32 {
                    let key = format!("k:{}", (i * 7 + t * 13) % 3_000);
                    match i % 4 {
                        0 | 1 => {
                            let size = (i % 50) as usize * 20;
                            let resp = ToolResponse::new(json!({"t": t, "pad": "x".repeat(size)}));
                            store.put_now(&key, resp, ttl);
                        }
                        2 => {
                            if let Some(hit) = store.get_now(&key) {
                                assert!(hit.response.output.get("t").is_some());
                            }
                        }
                        _ => {
                            store.remove_now(&key);
                        }
                    }
                    if i % 1_000 == 0 {
                        assert!(store.entries().len() <= cfg.max_entries);
                        assert!(store.entries().weighted_size() <= cfg.max_bytes);
                    }
                }
            });
        }
    });
    assert!(store.entries().len() <= cfg.max_entries);
    assert!(store.entries().weighted_size() <= cfg.max_bytes);
    assert!(!store.entries().is_empty());
}
