//! Values the stores did not write (a key overwritten by another client, a counter that is
//! not an integer) and durations at the edge of what a hand-built call can carry: a clear
//! store error or the documented bound, never a key treated as free, never a partial write.

mod common;

use std::time::Duration;

use common::{connect, prefix};
use redis::AsyncCommands;
use serde_json::json;
use toolshield_budget::{BudgetStore, Charge};
use toolshield_core::config::MAX_DURATION;
use toolshield_core::{Digest, ToolResponse};
use toolshield_idempotency::{ClaimOutcome, IdempotencyRecord, IdempotencyStore, RecordStatus};
use toolshield_ratelimit::{RateLimit, RateLimitStore};
use toolshield_redis::testing::test_redis;
use toolshield_redis::{budget_key, RedisBudgetStore, RedisIdempotencyStore, RedisRateLimitStore};

/// A plain client on the test Redis, playing the other client.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

#[tokio::test]
async fn a_rate_limit_key_holding_no_time_is_an_error_not_a_free_key() {
    let Some(redis) = test_redis("a_rate_limit_key_holding_no_time_is_an_error_not_a_free_key")
    else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, Duration::from_secs(1)).await;
    let store = RedisRateLimitStore::new(conn, "search");
    let mut other = raw(&redis.url()).await;
    let key = format!("{p}{}", store.storage_key(Some("alice")));
    // One call a minute, no burst: a second call now is over the limit.
    let limit = RateLimit::new(1, Duration::from_secs(60), 1);
    for foreign in ["not a time", "", "12abc", "inf", "nan", "1e400", "-5"] {
        let _: () = other.set(&key, foreign).await.unwrap();
        let got = store.acquire(Some("alice"), &limit, Duration::ZERO).await;
        assert!(
            got.is_err(),
            "{foreign:?}: a value the store did not write must be an error, got {got:?}"
        );
        let left: String = other.get(&key).await.unwrap();
        assert_eq!(left, foreign, "nothing written over it");
    }
}

fn charge(key: &str, cost: u64) -> Charge<'_> {
    Charge {
        key,
        tool: "search",
        max_calls: None,
        cost,
        run_max_calls: None,
        run_max_cost: None,
        ttl: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn a_budget_counter_that_is_not_an_integer_is_an_error_and_counts_nothing() {
    let Some(redis) =
        test_redis("a_budget_counter_that_is_not_an_integer_is_an_error_and_counts_nothing")
    else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, Duration::from_secs(1)).await;
    let store = RedisBudgetStore::new(conn);
    let mut other = raw(&redis.url()).await;
    for (n, field) in ["t:search", "#calls", "#cost"].into_iter().enumerate() {
        for foreign in ["1.5", "abc", "", "nan"] {
            let run = format!("r:run-{n}-{foreign}");
            let key = format!("{p}{}", budget_key(&run));
            let _: () = other
                .hset_multiple(&key, &[("t:search", "2"), ("#calls", "2"), ("#cost", "20")])
                .await
                .unwrap();
            let _: () = other.hset(&key, field, foreign).await.unwrap();
            let got = store.charge(charge(&run, 5)).await;
            assert!(got.is_err(), "{field}={foreign:?}: got {got:?}");
            let mut after: Vec<(String, String)> = other.hgetall(&key).await.unwrap();
            after.sort();
            let mut want = vec![
                ("#calls".to_owned(), "2".to_owned()),
                ("#cost".to_owned(), "20".to_owned()),
                ("t:search".to_owned(), "2".to_owned()),
            ];
            for w in &mut want {
                if w.0 == field {
                    w.1 = foreign.to_owned();
                }
            }
            assert_eq!(after, want, "{field}={foreign:?}: no counter moved");
        }
    }
}

#[tokio::test]
async fn idempotency_durations_past_the_longest_are_bounded_not_refused() {
    let Some(redis) = test_redis("idempotency_durations_past_the_longest_are_bounded_not_refused")
    else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, Duration::from_secs(1)).await;
    let s = RedisIdempotencyStore::new(conn);
    let mut other = raw(&redis.url()).await;
    let hash = Digest::of_bytes(b"p");
    for (n, huge) in [MAX_DURATION * 2, Duration::MAX].into_iter().enumerate() {
        let key = format!("idemp:{{pay}}:-:g:huge-{n}");
        let lease = huge;
        let claimed = s
            .claim(&key, IdempotencyRecord::pending(hash, "o", lease), lease)
            .await;
        assert_eq!(
            claimed.unwrap(),
            ClaimOutcome::Claimed,
            "{huge:?}: the claim is made"
        );
        assert!(s.renew(&key, "o", huge).await.unwrap(), "{huge:?}: renewed");
        let pttl: i64 = other.pttl(format!("{p}{key}")).await.unwrap();
        assert!(
            pttl > 0 && u128::try_from(pttl).unwrap() <= MAX_DURATION.as_millis(),
            "{huge:?}: pttl {pttl}"
        );
        let done =
            IdempotencyRecord::completed(hash, "o", ToolResponse::new(json!({"ok": true})), huge);
        assert!(
            s.finish(&key, "o", done, huge).await.unwrap(),
            "{huge:?}: the outcome is recorded"
        );
        let rec = s.get(&key).await.unwrap().expect("kept");
        assert_eq!(rec.status, RecordStatus::Completed);
        let pttl: i64 = other.pttl(format!("{p}{key}")).await.unwrap();
        assert!(
            pttl > 0 && u128::try_from(pttl).unwrap() <= MAX_DURATION.as_millis(),
            "{huge:?}: the record still expires, pttl {pttl}"
        );
    }
}

/// What another client may leave at a record key or a lease marker with no expiry
/// (`PTTL -1`): a PENDING record of an owner that is gone, text that is no record, a
/// value of another type, a marker of a claim for another payload.
#[tokio::test]
async fn a_claim_left_without_an_expiry_holds_its_key_for_one_lease_not_forever() {
    let Some(redis) =
        test_redis("a_claim_left_without_an_expiry_holds_its_key_for_one_lease_not_forever")
    else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, Duration::from_secs(1)).await;
    let s = RedisIdempotencyStore::new(conn);
    let mut other = raw(&redis.url()).await;
    let lease = Duration::from_millis(300);
    let ours = Digest::of_bytes(b"ours");
    let theirs = Digest::of_bytes(b"theirs");
    let pending = serde_json::to_string(&IdempotencyRecord::pending(theirs, "gone", lease))
        .expect("record encodes");
    let cases: [(&str, &str); 4] = [
        ("pending", "record"),
        ("garbage", "record"),
        ("hash", "record"),
        ("marker", "marker"),
    ];
    for (what, at) in cases {
        let key = format!("idemp:{{pay}}:-:g:no-expiry-{what}");
        let raw_key = format!("{p}{key}");
        let raw_marker = format!("{p}lease:{key}");
        match what {
            "pending" => other.set::<_, _, ()>(&raw_key, &pending).await.unwrap(),
            "garbage" => other.set::<_, _, ()>(&raw_key, "{not json").await.unwrap(),
            "hash" => other.hset::<_, _, _, ()>(&raw_key, "f", "v").await.unwrap(),
            _ => other
                .set::<_, _, ()>(&raw_marker, format!("gone\n{}", theirs.to_hex()))
                .await
                .unwrap(),
        }
        let target = if at == "record" {
            &raw_key
        } else {
            &raw_marker
        };
        let pttl: i64 = other.pttl(target).await.unwrap();
        assert_eq!(pttl, -1, "{what}: written without an expiry");

        // The first claim finds the key held (or unreadable): never claimed over it.
        let first = s
            .claim(&key, IdempotencyRecord::pending(ours, "me", lease), lease)
            .await;
        assert!(
            !matches!(
                first,
                Ok(ClaimOutcome::Claimed | ClaimOutcome::TakenOver { .. })
            ),
            "{what}: a foreign value is not a free key, got {first:?}"
        );
        // Within a few leases the key is free again: a claim succeeds.
        let got = common::eventually(lease * 10, "the key to be claimable", || {
            let s = s.clone();
            let key = key.clone();
            async move {
                match s
                    .claim(&key, IdempotencyRecord::pending(ours, "me", lease), lease)
                    .await
                {
                    Ok(outcome @ (ClaimOutcome::Claimed | ClaimOutcome::TakenOver { .. })) => {
                        Some(outcome)
                    }
                    _ => None,
                }
            }
        })
        .await;
        assert!(
            matches!(got, ClaimOutcome::Claimed | ClaimOutcome::TakenOver { .. }),
            "{what}: {got:?}"
        );
    }
}

#[tokio::test]
async fn a_cache_entry_left_without_an_expiry_is_refetched_and_then_expires() {
    let Some(redis) =
        test_redis("a_cache_entry_left_without_an_expiry_is_refetched_and_then_expires")
    else {
        return;
    };
    let p = prefix();
    let conn = connect(&redis.url(), &p, Duration::from_secs(1)).await;
    let store = std::sync::Arc::new(toolshield_redis::RedisCacheStore::new(conn));
    let layer = toolshield_cache::CacheLayer::with_store(
        toolshield_cache::CacheConfig {
            ttl: Duration::from_secs(60),
            ..toolshield_cache::CacheConfig::default()
        },
        store,
    )
    .expect("valid config");
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tool = common::counting_tool(runs.clone(), "tool", Duration::ZERO);
    let req = toolshield_core::ToolRequest::new("weather", json!({"city": "Oslo"}))
        .kind(toolshield_core::CallKind::ReadOnly);
    let key = format!(
        "{p}{}",
        toolshield_cache::storage_key("weather", None, &req.payload_digest().expect("digest"))
    );
    // Another client left an entry with no expiry: it would be served for good.
    let mut other = raw(&redis.url()).await;
    let stale = serde_json::to_string(&ToolResponse::new(json!("stale forever"))).unwrap();
    let _: () = other.set(&key, stale).await.unwrap();

    use tower::{Layer, ServiceExt};
    let res = layer.layer(tool).oneshot(req).await.expect("answer");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "fetched");
    assert!(!res.provenance.cache_hit);
    let pttl: i64 = other.pttl(&key).await.unwrap();
    assert!(
        pttl > 0 && pttl <= 60_000,
        "the entry written back expires, pttl {pttl}"
    );
}
