//! The in-memory store under keys a caller chooses: a million distinct keys hold at
//! most `max_keys` buckets; a key over its limit keeps its state while the keys active
//! at once fit in the bound (keys whose time has passed make room first, so a flood of
//! short-lived keys never hands a busy key a fresh burst); and keys are compared as the
//! exact strings they are (case, Unicode normalisation, separators and NUL all make a
//! different bucket). Paused clock.

use std::time::Duration;

use serde_json::json;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{ByCaller, Decision, MemoryRateLimitStore, RateLimit, RateLimitLayer};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

fn admitted_now(store: &MemoryRateLimitStore, key: &str, limit: &RateLimit) -> bool {
    match store.acquire_now(Some(key), limit, Duration::ZERO) {
        Some(Ok(Decision::Admit { wait, .. })) => wait.is_zero(),
        Some(Ok(Decision::Reject { .. })) => false,
        other => panic!("{key:?}: {other:?}"),
    }
}

use toolshield_ratelimit::RateLimitStore as _;

#[tokio::test(start_paused = true)]
async fn a_million_keys_hold_at_most_max_keys() {
    const MAX_KEYS: u64 = 1_000;
    let store = MemoryRateLimitStore::new(MAX_KEYS);
    let limit = RateLimit::new(1, Duration::from_secs(3600), 1);
    let mut most = 0;
    for n in 0..1_000_000u32 {
        assert!(admitted_now(&store, &format!("k{n}"), &limit), "key {n}");
        if n % 997 == 0 {
            most = most.max(store.len());
        }
    }
    most = most.max(store.len());
    assert!(most <= MAX_KEYS, "{most} keys held, bound {MAX_KEYS}");
}

#[tokio::test(start_paused = true)]
async fn a_key_over_its_limit_is_never_reset_while_the_active_keys_fit_the_bound() {
    // 10 calls a second, bursts of 10. The busy key calls every 10 ms, so it stays over
    // its limit; meanwhile one-off keys come and go, 2 every 100 ms, each holding its
    // bucket for one interval: about 20 keys active within any period, a fifth of the
    // bound. An evicted busy key would start afresh with a whole burst.
    const MAX_KEYS: u64 = 100;
    let store = MemoryRateLimitStore::new(MAX_KEYS);
    let limit = RateLimit::new(10, Duration::from_secs(1), 10);
    let start = tokio::time::Instant::now();
    let mut busy_admitted = Vec::new();
    let mut n = 0u32;
    for tick in 0..6_000u32 {
        if admitted_now(&store, "busy", &limit) {
            busy_admitted.push(start.elapsed());
        }
        if tick % 10 == 0 {
            for _ in 0..2 {
                assert!(admitted_now(&store, &format!("k{n}"), &limit));
                n += 1;
            }
        }
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    // 60 s: the burst of 10, then one call per 100 ms.
    assert!(
        busy_admitted.len() <= 10 + 600,
        "the busy key was admitted {} times in 60 s (limit 610): reset by eviction",
        busy_admitted.len()
    );
    for (i, t) in busy_admitted.iter().enumerate() {
        let in_one_second = busy_admitted[i..]
            .iter()
            .take_while(|u| **u < *t + Duration::from_secs(1))
            .count();
        assert!(
            in_one_second <= 19,
            "{in_one_second} calls of the busy key within 1 s from {t:?} (bound 19)"
        );
    }
    assert!(store.len() <= MAX_KEYS);
}

#[tokio::test(start_paused = true)]
async fn keys_that_differ_only_by_case_normalisation_separators_or_nul_are_separate_buckets() {
    let keys = [
        "alice",
        "Alice",
        "ALICE",
        "caf\u{e9}",   // NFC
        "cafe\u{301}", // NFD
        "a:b",
        "a|b",
        "a|+b",
        "a/b",
        "a\u{0}b",
        "a\u{0}",
        "a",
        "a ",
        "\u{200b}a",
        "",
    ];
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(3600), 1))
        .keyed(ByCaller)
        .layer(BoxCloneService::new(service_fn(
            |_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!("ok"))) },
        )));
    let req = |k: &str| ToolRequest::new("search", json!({})).caller(k);
    for k in keys {
        let r = svc.clone().oneshot(req(k)).await;
        assert!(
            r.is_ok(),
            "{k:?} shares a bucket with an earlier key: {r:?}"
        );
    }
    // No caller at all is a bucket of its own, too.
    assert!(svc
        .clone()
        .oneshot(ToolRequest::new("search", json!({})))
        .await
        .is_ok());
    for k in keys {
        let err = svc.clone().oneshot(req(k)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RateLimited, "{k:?}");
    }
}
