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

#[tokio::test(start_paused = true)]
async fn an_entry_updated_every_turn_survives_a_flood() {
    // A rate limiter's or a budget's entry is never read, only updated in place: that is
    // a use too, and a flood of one-off keys must not evict it.
    let map = TtlMap::new(MemoryBounds::new(1_600, 1_000_000));
    map.insert("hot", 0u32, 10, MIN);
    for i in 0..20_000u32 {
        let seen = map.update("hot", |found| match found {
            Some(f) if f.live => (
                Write::Touch {
                    weight: 10,
                    ttl: MIN,
                    linger: Duration::ZERO,
                },
                true,
            ),
            _ => (put(0, MIN, Duration::ZERO), false),
        });
        assert!(seen, "hot entry evicted at {i}");
        // Every other turn a new value is put in its place, as a limiter does.
        if i % 2 == 0 {
            map.update("hot", |_| (put(i, MIN, Duration::ZERO), ()));
        }
        map.insert(&format!("cold-{i}"), i, 10, MIN);
    }
}

mod model {
    //! The map against a model, for any sequence of writes and reads: with room for every
    //! key it answers what a plain map would; with little room it may forget a key but
    //! never answers an older value than the last one written, and both bounds hold.

    use std::collections::HashMap;
    use std::time::Duration;

    use proptest::prelude::*;
    use toolshield_store::{MemoryBounds, TtlMap, Write};

    const TTL: Duration = Duration::from_secs(600);

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u32),
        Put(u8, u32),
        Remove(u8),
        UpdateRemove(u8),
        Get(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Keys of several lengths, so that short and long keys share the shards.
        let key = 0u8..48;
        prop_oneof![
            (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Put(k, v)),
            key.clone().prop_map(Op::Remove),
            key.clone().prop_map(Op::UpdateRemove),
            key.prop_map(Op::Get),
        ]
    }

    fn name(k: u8) -> String {
        format!("cache:{{tool}}:-:{}", "k".repeat(usize::from(k)))
    }

    /// Runs `ops` on a map with `bounds`; `exact` when every key fits.
    fn check(bounds: MemoryBounds, ops: &[Op], exact: bool) -> Result<(), TestCaseError> {
        let map: TtlMap<u32> = TtlMap::new(bounds);
        let mut model: HashMap<u8, u32> = HashMap::new();
        for op in ops {
            match *op {
                Op::Insert(k, v) => {
                    prop_assert!(map.insert(&name(k), v, 10, TTL));
                    model.insert(k, v);
                }
                Op::Put(k, v) => {
                    map.update(&name(k), |_| {
                        let put = Write::Put {
                            value: v,
                            weight: 10,
                            ttl: TTL,
                            linger: Duration::ZERO,
                        };
                        (put, ())
                    });
                    model.insert(k, v);
                }
                Op::Remove(k) => {
                    let was = map.remove(&name(k));
                    let had = model.remove(&k).is_some();
                    if exact {
                        prop_assert_eq!(was, had);
                    } else {
                        prop_assert!(!was || had, "a removed key was never written");
                    }
                }
                Op::UpdateRemove(k) => {
                    map.update(&name(k), |_| (Write::Remove, ()));
                    model.remove(&k);
                }
                Op::Get(k) => {
                    let got = map.get(&name(k), |v, _| *v);
                    if exact {
                        prop_assert_eq!(got, model.get(&k).copied());
                    } else if let Some(got) = got {
                        prop_assert_eq!(
                            Some(got),
                            model.get(&k).copied(),
                            "only the last value written"
                        );
                    }
                }
            }
            prop_assert!(map.len() <= bounds.max_entries);
            prop_assert!(map.weighted_size() <= bounds.max_bytes);
        }
        if exact {
            prop_assert_eq!(map.len(), model.len() as u64);
            for (k, v) in &model {
                prop_assert_eq!(map.get(&name(*k), |v, _| *v), Some(*v));
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn with_room_for_every_key_it_is_a_map(ops in prop::collection::vec(op(), 1..300)) {
            check(MemoryBounds::new(1_024, 1 << 20), &ops, true)?;
        }

        #[test]
        fn with_little_room_it_forgets_but_never_answers_an_old_value(
            ops in prop::collection::vec(op(), 1..300),
        ) {
            check(MemoryBounds::new(32, 320), &ops, false)?;
        }
    }
}

/// A value whose drop reads the map it was stored in (a value holding a handle that
/// reports to the store when released, say).
struct ReadsTheMapOnDrop;

static REENTRANT: std::sync::OnceLock<TtlMap<ReadsTheMapOnDrop>> = std::sync::OnceLock::new();
static DROPPED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for ReadsTheMapOnDrop {
    fn drop(&mut self) {
        if let Some(map) = REENTRANT.get() {
            // Takes every shard's read lock: under a write lock of this thread it would
            // never return.
            let _ = map.len();
        }
        DROPPED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Every way a write takes a value out (eviction, replacement, removal, a heavier value,
/// a touch it no longer fits, an expired entry met by a read) frees it after the shard's lock is released: a value
/// whose drop reads the map does not deadlock, and freeing an evicted response is never
/// done while other callers wait for the shard.
#[test]
fn values_taken_out_by_a_write_are_dropped_after_the_lock_is_released() {
    use std::sync::atomic::Ordering::SeqCst;
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // The map's clock is tokio's: paused here, and moved on by hand below.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        let _clock = rt.enter();
        // One shard of one entry and 100 bytes.
        let map = REENTRANT.get_or_init(|| TtlMap::new(MemoryBounds::new(1, 100)));
        let v = || ReadsTheMapOnDrop;
        map.insert("a", v(), 10, MIN);
        map.insert("b", v(), 10, MIN); // evicts `a`
        assert_eq!(DROPPED.load(SeqCst), 1, "eviction");
        map.insert("b", v(), 10, MIN); // replaces in place
        assert_eq!(DROPPED.load(SeqCst), 2, "replacement");
        assert!(!map.insert("b", v(), 1_000, MIN)); // heavier than the map: the old one goes
        assert_eq!(DROPPED.load(SeqCst), 4, "a heavier value and the old one");
        let put_d = || {
            map.update("d", |_| {
                (
                    Write::Put {
                        value: v(),
                        weight: 10,
                        ttl: MIN,
                        linger: Duration::ZERO,
                    },
                    (),
                )
            })
        };
        put_d();
        put_d();
        assert_eq!(DROPPED.load(SeqCst), 5, "replacement through update");
        map.update("d", |_| (Write::Remove, ()));
        assert_eq!(DROPPED.load(SeqCst), 6, "removal through update");
        map.insert("e", v(), 10, MIN);
        assert!(map.remove("e"));
        assert_eq!(DROPPED.load(SeqCst), 7, "removal");
        map.insert("g", v(), 10, MIN);
        map.update("g", |_| {
            (
                Write::Touch {
                    weight: 1_000,
                    ttl: MIN,
                    linger: Duration::ZERO,
                },
                (),
            )
        });
        assert_eq!(DROPPED.load(SeqCst), 8, "a touch the entry no longer fits");
        map.insert("f", v(), 10, Duration::from_millis(1));
        rt.block_on(advance(Duration::from_millis(20)));
        assert!(map.get("f", |_, _| ()).is_none());
        assert_eq!(DROPPED.load(SeqCst), 9, "an expired entry met by a read");
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(20))
        .expect("a value dropped under the shard's write lock deadlocked (or the thread failed)");
}

#[tokio::test(start_paused = true)]
async fn a_live_held_entry_survives_a_flood_and_a_full_shard_refuses_the_write() {
    let map: TtlMap<u32> = TtlMap::new(MemoryBounds::new(1, 1 << 20));
    let hold = |v| Write::Hold {
        value: v,
        weight: 8,
        ttl: Duration::from_secs(30),
        linger: Duration::ZERO,
    };
    let ((), stored) = map.try_update("claim", |_| (hold(1), ()));
    assert!(stored);
    for i in 0..10_000 {
        assert!(
            !map.insert(&format!("k{i}"), 2, 8, Duration::from_secs(60)),
            "no room beside a live held entry"
        );
        assert_eq!(map.len(), 1);
    }
    let ((), stored) = map.try_update("other", |_| (hold(3), ()));
    assert!(!stored, "a held write finds no room either");
    assert_eq!(map.get("claim", |v, _| *v), Some(1), "the held entry stays");
    tokio::time::advance(Duration::from_secs(31)).await;
    assert!(
        map.insert("k", 4, 8, Duration::from_secs(60)),
        "an expired hold is evicted"
    );
    assert_eq!(map.get("k", |v, _| *v), Some(4));
    assert_eq!(map.len(), 1);
}
