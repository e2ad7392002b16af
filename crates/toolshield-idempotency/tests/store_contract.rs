//! The idempotency store contract suite, run for the in-memory store, and its memory bound.

use std::time::Duration;

use serde_json::json;
use toolshield_core::{Digest, ToolError, ToolResponse};
use toolshield_idempotency::testing::contract;
use toolshield_idempotency::{
    record_weight, ClaimOutcome, IdempotencyRecord, IdempotencyStore, InMemoryIdempotencyStore,
    MemoryBounds,
};

#[tokio::test(start_paused = true)]
async fn in_memory_store_passes_the_contract() {
    contract::run_all(InMemoryIdempotencyStore::new).await;
}

#[tokio::test(start_paused = true)]
async fn in_memory_store_as_trait_object_passes_the_contract() {
    let store: Box<dyn IdempotencyStore> = Box::new(InMemoryIdempotencyStore::new());
    contract::claim_returns_existing(&*store).await;
    contract::expired_lease_is_taken_over(&*store).await;
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_claim_holds_its_key_against_another_payload() {
    contract::a_lapsed_claim_holds_its_key_against_another_payload(&InMemoryIdempotencyStore::new())
        .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_a_million_keys_never_exceeds_the_bound() {
    let cfg = MemoryBounds {
        max_entries: 1_000,
        max_bytes: 1_000_000,
    };
    let store = InMemoryIdempotencyStore::with_config(&cfg).expect("valid");
    let lease = Duration::from_secs(3600);
    let hash = Digest::of_bytes(b"payload");
    for i in 0..1_000_000u32 {
        let key = format!("idemp:{{flood}}:{i}");
        let rec = IdempotencyRecord::pending(hash, "owner", lease);
        let out = store.claim(&key, rec, lease).await.expect("claim");
        assert_eq!(out, ClaimOutcome::Claimed);
        // Finished, so eviction may take it: a running claim is never evicted.
        let done = IdempotencyRecord::failed(
            hash,
            "owner",
            &ToolError::invalid_input("no"),
            Duration::from_secs(3600),
        );
        let finished = store.finish(&key, "owner", done, lease).await;
        assert_eq!(finished.ok(), Some(true));
        if i % 10_000 == 9_999 {
            store.entries().purge_expired();
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
    store.entries().purge_expired();
    assert!(store.entries().len() <= cfg.max_entries);
    assert!(!store.entries().is_empty());
}

#[test]
fn bounds_are_validated() {
    let err = MemoryBounds {
        max_entries: 10,
        max_bytes: 5,
    }
    .validate()
    .expect_err("invalid");
    assert_eq!(err.problems().len(), 1);
    assert!(
        InMemoryIdempotencyStore::with_config(&InMemoryIdempotencyStore::DEFAULT_BOUNDS).is_ok()
    );
}

/// A record weighs its key and what it holds: a PENDING claim its owner token, a
/// COMPLETED record its response too, whose output counts by its compact JSON length; the
/// store's weighted size is the sum, and a longer output weighs that much more.
#[tokio::test(start_paused = true)]
async fn a_record_weighs_its_key_and_what_it_holds() {
    let store = InMemoryIdempotencyStore::new();
    let ttl = Duration::from_secs(60);
    let hash = Digest::of_bytes(b"payload");
    let key = "idemp:{pay}:order-1";
    let pending = IdempotencyRecord::pending(hash, "owner-1", ttl);
    let expected = u64::try_from(key.len() + record_weight(&pending)).expect("fits");
    assert_eq!(
        store.claim(key, pending, ttl).await.expect("claim"),
        ClaimOutcome::Claimed
    );
    assert_eq!(store.entries().weighted_size(), expected);

    let short = IdempotencyRecord::completed(hash, "owner-1", ToolResponse::new(json!("ok")), ttl);
    let long = IdempotencyRecord::completed(
        hash,
        "owner-1",
        ToolResponse::new(json!("ok".repeat(500))),
        ttl,
    );
    assert_eq!(
        record_weight(&long) - record_weight(&short),
        "ok".repeat(500).len() - "ok".len()
    );
    let expected = u64::try_from(key.len() + record_weight(&long)).expect("fits");
    assert!(store
        .finish(key, "owner-1", long, ttl)
        .await
        .expect("finish"));
    assert_eq!(store.entries().weighted_size(), expected);
}
