//! Behaviour of the shared TTL map, on a paused clock.

use std::time::Duration;

use tokio::time::advance;
use toolshield_store::{MemoryBounds, TtlMap, Write};

const MIN: Duration = Duration::from_secs(60);

fn put(value: u32, ttl: Duration, linger: Duration) -> Write<u32> {
    Write::Put {
        value,
        weight: 10,
        ttl,
        linger,
    }
}

#[tokio::test(start_paused = true)]
async fn entries_expire_and_count_down() {
    let map = TtlMap::new(MemoryBounds::new(100, 10_000));
    assert!(map.insert("k", 1u32, 10, MIN));
    advance(MIN / 2).await;
    assert_eq!(map.get("k", |v, left| (*v, left)), Some((1, MIN / 2)));
    advance(MIN / 2).await;
    assert_eq!(map.get("k", |v, _| *v), None, "expired at its TTL");
    assert_eq!(map.len(), 0, "an expired entry met by a read is freed");
}

#[tokio::test(start_paused = true)]
async fn a_lingering_entry_is_seen_by_update_but_never_read() {
    let map = TtlMap::new(MemoryBounds::new(100, 10_000));
    map.update("k", |_| (put(1, MIN, MIN), ()));
    advance(MIN + MIN / 2).await;
    assert_eq!(map.get("k", |v, _| *v), None, "reads never see it");
    let seen = map.update("k", |found| {
        let seen = found.map(|f| (*f.value, f.live));
        (Write::Keep, seen)
    });
    assert_eq!(seen, Some((1, false)), "update sees it, not live");
    map.purge_expired();
    assert_eq!(map.len(), 1, "purge keeps a lingering entry");
    advance(MIN).await;
    assert!(
        !map.update("k", |found| (Write::Keep, found.is_some())),
        "gone one linger after its TTL"
    );
    map.purge_expired();
    assert_eq!(map.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn both_bounds_hold_after_every_write() {
    let bounds = MemoryBounds::new(64, 2_000);
    let map = TtlMap::with_bounds(bounds).expect("valid");
    for i in 0..10_000u32 {
        map.insert(&format!("key-{i}"), i, 40, MIN);
        assert!(map.len() <= bounds.max_entries, "entries at {i}");
        assert!(map.weighted_size() <= bounds.max_bytes, "bytes at {i}");
    }
    assert!(!map.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_value_heavier_than_a_shard_share_is_not_stored_and_drops_the_old_one() {
    let map = TtlMap::new(MemoryBounds::new(16, 1_600));
    assert_eq!(map.max_weight(), 100, "16 shards share 1,600 bytes");
    assert!(map.insert("k", 1u32, 100, MIN));
    assert!(!map.insert("k", 2u32, 101, MIN));
    assert_eq!(map.get("k", |v, _| *v), None);
}

#[tokio::test(start_paused = true)]
async fn an_entry_read_every_turn_survives_a_flood() {
    // 16 shards of 100 entries: each shard's hand turns many times over the flood.
    let map = TtlMap::new(MemoryBounds::new(1_600, 1_000_000));
    map.insert("hot", 0u32, 10, MIN);
    for i in 0..20_000u32 {
        assert!(
            map.get("hot", |v, _| *v).is_some(),
            "hot entry evicted at {i}"
        );
        map.insert(&format!("cold-{i}"), i, 10, MIN);
    }
}
