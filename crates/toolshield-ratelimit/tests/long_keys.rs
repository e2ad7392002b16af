//! Keys too long to store: every key longer than about 4 KiB shares one overflow bucket,
//! whatever the store's bound on keys, so one huge key can neither take a shard's memory
//! (evicting the buckets of every other caller in it) nor escape the limit.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{ByCaller, MemoryRateLimitStore, RateLimit, RateLimitLayer};
use tower::{service_fn, Layer, ServiceExt};

fn req(caller: String) -> ToolRequest {
    ToolRequest::new("search", json!({})).caller(caller)
}

#[tokio::test(start_paused = true)]
async fn keys_longer_than_four_kib_share_one_overflow_bucket() {
    // The default bound: 10,000 keys.
    let store = Arc::new(MemoryRateLimitStore::default());
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(3600), 1))
        .with_store(store.clone())
        .keyed(ByCaller)
        .layer(service_fn(|_req: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!(null)))
        }));

    // A key of ordinary length has a bucket of its own.
    let ordinary = "o".repeat(4000);
    assert!(svc.clone().oneshot(req(ordinary.clone())).await.is_ok());
    assert!(svc.clone().oneshot(req(ordinary)).await.is_err());
    assert_eq!(store.len(), 1);

    // Two different long keys are limited together, and neither is stored.
    let a = format!("a{}", "x".repeat(64 << 10));
    let b = format!("b{}", "x".repeat(64 << 10));
    assert!(svc.clone().oneshot(req(a)).await.is_ok());
    let err = svc.clone().oneshot(req(b)).await.unwrap_err();
    assert!(err.retry_after().is_some());
    assert_eq!(store.len(), 1);
}

#[test]
fn a_key_count_bound_above_max_keys_is_a_config_error() {
    // A bound of u64::MAX is no bound against a flood of distinct callers.
    use toolshield_core::config::MAX_KEYS;
    use toolshield_ratelimit::RateLimitConfig;
    for max_keys in [0, MAX_KEYS as u64 + 1, u64::MAX] {
        let cfg = RateLimitConfig {
            max_keys,
            ..RateLimitConfig::default()
        };
        let err = cfg.validate().expect_err("refused");
        assert_eq!(err.problems()[0].field, "max_keys", "{max_keys}: {err}");
    }
    let at_bound = RateLimitConfig {
        max_keys: MAX_KEYS as u64,
        ..RateLimitConfig::default()
    };
    assert!(at_bound.validate().is_ok());
}
