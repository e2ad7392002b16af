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

#[tokio::test]
async fn a_resent_takeover_is_still_a_takeover_with_its_token() {
    let Some(redis) = test_redis("a_resent_takeover_is_still_a_takeover_with_its_token") else {
        return;
    };
    let s = store(redis.url()).await;
    let key = "idemp:{pay}:-:g:resend-takeover";
    let lease = Duration::from_millis(200);
    let hash = Digest::of_bytes(b"p");
    s.claim(
        key,
        IdempotencyRecord::pending(hash, "owner-0", lease),
        lease,
    )
    .await
    .unwrap();
    assert!(s
        .mark_resume(key, "owner-0", "task-1", lease)
        .await
        .unwrap());
    tokio::time::sleep(lease + lease / 2).await;
    let mine = IdempotencyRecord::pending(hash, "owner-1", lease);
    let first = s.claim(key, mine.clone(), lease).await.unwrap();
    assert_eq!(
        first,
        ClaimOutcome::TakenOver {
            resume: Some("task-1".to_owned())
        }
    );
    // The same claim again: what its first send took over is still reported.
    assert_eq!(s.claim(key, mine, lease).await.unwrap(), first);
}

#[tokio::test]
async fn a_lease_marker_without_a_json_token_resumes_nothing() {
    let Some(redis) = test_redis("a_lease_marker_without_a_json_token_resumes_nothing") else {
        return;
    };
    // No key prefix: the test writes the marker by hand, under its documented name.
    let conn = RedisConnection::connect(RedisConfig::from_url(redis.url()))
        .await
        .expect("redis");
    let s = RedisIdempotencyStore::new(conn);
    let key = format!("idemp:{{pay}}:-:g:odd-marker-{}", unique_prefix());
    let lease = Duration::from_millis(200);
    let hash = Digest::of_bytes(b"p");
    let mut raw = redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    for (i, marker) in [
        "owner-0\nnot json",
        "owner-0\n\"unterminated",
        "owner-0\n\"a\",\"status\":\"COMPLETED\"",
        "owner-0",
        "\n\"\"",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("{key}-{i}");
        s.claim(
            &key,
            IdempotencyRecord::pending(hash, "owner-0", lease),
            lease,
        )
        .await
        .unwrap();
        let _: () = redis::cmd("SET")
            .arg(format!("lease:{key}"))
            .arg(marker)
            .arg("PX")
            .arg(10_000)
            .query_async(&mut raw)
            .await
            .expect("set marker");
        tokio::time::sleep(lease + lease / 2).await;
        let outcome = s
            .claim(
                &key,
                IdempotencyRecord::pending(hash, "owner-1", lease),
                lease,
            )
            .await
            .unwrap();
        match outcome {
            // `""` decodes, and the layer refuses the empty token itself.
            ClaimOutcome::TakenOver { resume } if marker == "\n\"\"" => {
                assert_eq!(resume.as_deref(), Some(""))
            }
            ClaimOutcome::TakenOver { resume } => assert_eq!(resume, None, "{marker:?}"),
            other => panic!("a takeover, got {other:?}"),
        }
        let rec = s.get(&key).await.unwrap().expect("the new claim");
        assert!(rec.is_owned_by("owner-1"), "{marker:?}: {rec:?}");
    }
}
