//! The resume token on a lease marker belongs to the payload digest written beside it: a
//! claim with another payload finds the key held; a marker without a digest (written before
//! the digest was kept, or by hand) holds off nobody and resumes as before.

use std::time::Duration;

use toolshield_core::Digest;
use toolshield_idempotency::{ClaimOutcome, IdempotencyRecord, IdempotencyStore};
use toolshield_redis::testing::{test_redis, unique_prefix};
use toolshield_redis::{RedisConfig, RedisConnection, RedisIdempotencyStore};

#[tokio::test]
async fn a_resume_token_is_taken_over_only_by_a_claim_with_its_payload() {
    let Some(redis) = test_redis("a_resume_token_is_taken_over_only_by_a_claim_with_its_payload")
    else {
        return;
    };
    // No key prefix: the test writes markers by hand, under their documented name.
    let conn = RedisConnection::connect(RedisConfig::from_url(redis.url()))
        .await
        .expect("redis");
    let s = RedisIdempotencyStore::new(conn);
    let mut raw = redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let lease = Duration::from_millis(200);
    let first = Digest::of_bytes(b"amount 42");
    let other = Digest::of_bytes(b"amount 99");
    let key = format!("idemp:{{pay}}:-:g:payload-marker-{}", unique_prefix());

    // Marked by its owner, which dies: another payload finds the key held, for the first.
    s.claim(
        &key,
        IdempotencyRecord::pending(first, "owner-0", lease),
        lease,
    )
    .await
    .unwrap();
    assert!(s
        .mark_resume(&key, "owner-0", "task-1", lease)
        .await
        .unwrap());
    tokio::time::sleep(lease + lease / 2).await;
    match s
        .claim(
            &key,
            IdempotencyRecord::pending(other, "owner-1", lease),
            lease,
        )
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(rec) => {
            assert_eq!(rec.payload_hash, first);
            assert_eq!(rec.owner, "owner-0");
        }
        found => panic!("another payload must not take the work over: {found:?}"),
    }
    // The first payload takes it over and resumes; its own marker keeps the digest, so a
    // second takeover holds another payload off too.
    assert_eq!(
        s.claim(
            &key,
            IdempotencyRecord::pending(first, "owner-2", lease),
            lease
        )
        .await
        .unwrap(),
        ClaimOutcome::TakenOver {
            resume: Some("task-1".to_owned())
        }
    );
    tokio::time::sleep(lease + lease / 2).await;
    assert!(matches!(
        s.claim(
            &key,
            IdempotencyRecord::pending(other, "owner-3", lease),
            lease
        )
        .await
        .unwrap(),
        ClaimOutcome::Existing(_)
    ));

    // Markers without a usable digest line hold off no payload.
    for (i, marker) in ["owner-0\n\"task-1\"", "owner-0\nnot-a-digest\n\"task-1\""]
        .into_iter()
        .enumerate()
    {
        let key = format!("{key}-{i}");
        s.claim(
            &key,
            IdempotencyRecord::pending(first, "owner-0", lease),
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
        assert_eq!(
            s.claim(
                &key,
                IdempotencyRecord::pending(other, "owner-1", lease),
                lease
            )
            .await
            .unwrap(),
            ClaimOutcome::TakenOver {
                resume: Some("task-1".to_owned())
            },
            "{marker:?}"
        );
    }
}
