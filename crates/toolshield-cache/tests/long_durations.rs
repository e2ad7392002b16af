//! A TTL and a grace at the longest a configuration allows: the store keeps an entry at
//! most `MAX_DURATION`, and the entry is still fresh for its whole TTL.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_cache::{CacheConfig, CacheLayer};
use toolshield_core::config::MAX_DURATION;
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::BoxedTool;
use tower::{service_fn, Layer, ServiceExt};

fn weather() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly)
}

fn counting(calls: &Arc<AtomicUsize>) -> BoxedTool {
    let calls = Arc::clone(calls);
    BoxedTool::new(service_fn(move |_req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, ToolError>(ToolResponse::new(json!({ "n": n }))) }
    }))
}

const DAY: Duration = Duration::from_secs(24 * 3600);

#[tokio::test(start_paused = true)]
async fn an_entry_stays_fresh_for_its_ttl_when_ttl_and_grace_pass_the_store_limit() {
    for (ttl, grace, later) in [
        (MAX_DURATION, MAX_DURATION, DAY),
        (MAX_DURATION, MAX_DURATION, MAX_DURATION - DAY),
        (200 * DAY, 200 * DAY, 190 * DAY),
        (MAX_DURATION, Duration::from_secs(1), DAY),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let layer = CacheLayer::new(
            CacheConfig::default()
                .with_ttl(ttl)
                .with_stale_if_error(grace),
        )
        .expect("durations at the limit are valid");
        let first = layer
            .layer(counting(&calls))
            .oneshot(weather())
            .await
            .expect("miss");
        assert!(!first.provenance.cache_hit);
        advance(later).await;
        let second = layer
            .layer(counting(&calls))
            .oneshot(weather())
            .await
            .expect("hit");
        assert!(
            second.provenance.cache_hit && !second.provenance.stale,
            "ttl {ttl:?}, grace {grace:?}: still fresh {later:?} later"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "ttl {ttl:?}, grace {grace:?}"
        );
    }
}
