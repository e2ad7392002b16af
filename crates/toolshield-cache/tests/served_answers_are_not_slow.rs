//! An answer the cache serves did not wait for the tool: a fresh hit, a stale entry
//! served for a failure, and a follower of a flight are never marked slow, even when the
//! call that fetched the data crossed the soft threshold. Otherwise every hit of a slow
//! result would count again in `tool_slow_calls_total` and show `provenance.slow`.
//! On a paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_cache::{CacheConfig, CacheLayer};
use toolshield_core::{
    CallKind, ErrorKind, ShieldResponse, SlowCall, ToolError, ToolRequest, ToolResponse,
};
use toolshield_test::{counting_tool, BoxedTool};
use tower::{Layer, ServiceExt};

/// What the timeout layer inside the cache leaves on a success past its 2 s threshold.
fn slow_success(n: usize) -> Result<ToolResponse, ToolError> {
    let mut res = ToolResponse::new(json!({ "n": n }));
    res.mark_slow(SlowCall {
        elapsed: Duration::from_secs(3),
        threshold: Duration::from_secs(2),
    });
    Ok(res)
}

fn req() -> ToolRequest {
    ToolRequest::new("reports", json!({"q": 1})).kind(CallKind::ReadOnly)
}

fn cache(ttl: Duration, grace: Duration) -> CacheLayer {
    CacheLayer::new(
        CacheConfig::default()
            .with_ttl(ttl)
            .with_stale_if_error(grace),
    )
    .expect("valid config")
}

fn assert_not_slow(res: &ToolResponse, what: &str) {
    assert!(res.provenance.cache_hit, "{what}: served by the cache");
    assert!(!res.provenance.slow, "{what}: provenance.slow");
    assert!(!res.is_slow(), "{what}: the slow-call mark");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_hit_of_a_slow_result_is_not_slow() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool: BoxedTool = counting_tool(&calls, Duration::from_secs(3), slow_success);
    let layer = cache(Duration::from_secs(60), Duration::ZERO);
    let first = layer.layer(tool.clone()).oneshot(req()).await.unwrap();
    assert!(
        first.is_slow() && first.provenance.slow,
        "the fetch was slow"
    );
    let hit = layer.layer(tool).oneshot(req()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_not_slow(&hit, "fresh hit");
}

#[tokio::test(start_paused = true)]
async fn a_follower_of_a_slow_flight_is_not_slow() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool: BoxedTool = counting_tool(&calls, Duration::from_secs(3), slow_success);
    let layer = cache(Duration::from_secs(60), Duration::ZERO);
    let leader = tokio::spawn(layer.layer(tool.clone()).oneshot(req()));
    tokio::time::sleep(Duration::from_millis(2_900)).await;
    let follower = layer.layer(tool).oneshot(req()).await.unwrap();
    let leader = leader.await.unwrap().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(leader.is_slow() && !leader.provenance.cache_hit);
    assert_not_slow(&follower, "follower");
}

#[tokio::test(start_paused = true)]
async fn a_stale_entry_served_for_a_failure_is_not_slow() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool: BoxedTool = counting_tool(&calls, Duration::ZERO, |n| {
        if n == 1 {
            slow_success(n)
        } else {
            Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
        }
    });
    let layer = cache(Duration::from_secs(60), Duration::from_secs(600));
    layer.layer(tool.clone()).oneshot(req()).await.unwrap();
    tokio::time::advance(Duration::from_secs(61)).await;
    let stale = layer.layer(tool).oneshot(req()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(stale.provenance.stale);
    assert_not_slow(&stale, "stale entry");
}
