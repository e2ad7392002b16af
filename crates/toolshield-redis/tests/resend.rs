//! A command the client resends after its connection broke may have run on the server
//! already (the cluster client resends on a dropped connection): the claim and the outcome
//! write recognise their own first run, by the claim's owner token.

use std::time::Duration;

use serde_json::json;
use toolshield_core::{Digest, ToolResponse};
use toolshield_idempotency::{ClaimOutcome, IdempotencyRecord, IdempotencyStore};
use toolshield_redis::testing::{test_redis, unique_prefix};
use toolshield_redis::{RedisConfig, RedisConnection, RedisIdempotencyStore};

async fn store(url: String) -> RedisIdempotencyStore {
    let config = RedisConfig::from_url(url).with_key_prefix(unique_prefix());
    RedisIdempotencyStore::new(RedisConnection::connect(config).await.expect("redis"))
}

#[tokio::test]
async fn a_resent_claim_is_the_claim_it_resends_and_another_owner_is_still_held_off() {
    let Some(redis) =
        test_redis("a_resent_claim_is_the_claim_it_resends_and_another_owner_is_still_held_off")
    else {
        return;
    };
    let s = store(redis.url()).await;
    let key = "idemp:{pay}:-:g:resend";
    let lease = Duration::from_secs(5);
    let mine = IdempotencyRecord::pending(Digest::of_bytes(b"p"), "owner-1", lease);
    assert!(matches!(
        s.claim(key, mine.clone(), lease).await.unwrap(),
        ClaimOutcome::Claimed
    ));
    // The same claim again (same owner token): it is ours, not a duplicate to wait for.
    assert!(matches!(
        s.claim(key, mine, lease).await.unwrap(),
        ClaimOutcome::Claimed
    ));
    // Another owner still finds the claim held.
    let other = IdempotencyRecord::pending(Digest::of_bytes(b"p"), "owner-2", lease);
    match s.claim(key, other, lease).await.unwrap() {
        ClaimOutcome::Existing(rec) => assert_eq!(rec.owner, "owner-1"),
        other => panic!("another owner must be held off, got {other:?}"),
    }
}

#[tokio::test]
async fn a_resent_outcome_write_is_reported_done_and_never_replaces_another_record() {
    let Some(redis) =
        test_redis("a_resent_outcome_write_is_reported_done_and_never_replaces_another_record")
    else {
        return;
    };
    let s = store(redis.url()).await;
    let key = "idemp:{pay}:-:g:resend-complete";
    let lease = Duration::from_secs(5);
    let hash = Digest::of_bytes(b"p");
    let pending = IdempotencyRecord::pending(hash, "owner-1", lease);
    s.claim(key, pending, lease).await.unwrap();
    let ttl = Duration::from_secs(60);
    let done = IdempotencyRecord::completed(
        hash,
        "owner-1",
        ToolResponse::new(json!({"charge": 1})),
        ttl,
    );
    assert!(s.finish(key, "owner-1", done.clone(), ttl).await.unwrap());
    // The identical write again: it is there, so it is done.
    assert!(s.finish(key, "owner-1", done, ttl).await.unwrap());
    // A different write by the same owner token is refused: the record is finished.
    let other = IdempotencyRecord::completed(
        hash,
        "owner-1",
        ToolResponse::new(json!({"charge": 2})),
        ttl,
    );
    assert!(!s.finish(key, "owner-1", other, ttl).await.unwrap());
    let there = s.get(key).await.unwrap().expect("the record");
    assert_eq!(
        there.result.map(|r| r.output),
        Some(json!({"charge": 1})),
        "a finished record is never replaced"
    );
}
