//! A stale entry is served only within its stale-if-error grace, judged when the tool's
//! failure is known, not when the entry was looked up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_cache::{CacheConfig, CacheLayer};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::BoxedTool;
use tower::{service_fn, Layer, ServiceExt};

fn weather() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly)
}

/// Answers at once the first time; later calls hang for `slow` and then time out.
fn slow_after_first(calls: &Arc<AtomicUsize>, slow: Duration) -> BoxedTool {
    let calls = Arc::clone(calls);
    BoxedTool::new(service_fn(move |_req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if n == 1 {
                return Ok(ToolResponse::new(json!({ "n": n })));
            }
            tokio::time::sleep(slow).await;
            Err(ToolError::timeout("attempt exceeded 30s"))
        }
    }))
}

#[tokio::test(start_paused = true)]
async fn a_stale_entry_whose_grace_ends_during_the_call_is_not_served() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = slow_after_first(&calls, Duration::from_secs(30));
    let layer = CacheLayer::new(
        CacheConfig::default()
            .with_ttl(Duration::from_secs(10))
            .with_stale_if_error(Duration::from_secs(20)),
    )
    .expect("valid config");
    let handle = layer.handle();
    layer
        .layer(svc.clone())
        .oneshot(weather())
        .await
        .expect("miss");

    // 25 s in: stale, with 5 s of grace left when the tool is called. The tool fails
    // 30 s later, 25 s after the grace ended: the entry is no longer servable.
    advance(Duration::from_secs(25)).await;
    let err = layer
        .layer(svc.clone())
        .oneshot(weather())
        .await
        .expect_err("the grace ended before the tool failed");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(handle.counts().stale, 0, "no stale entry served");
}

#[tokio::test(start_paused = true)]
async fn a_stale_entry_is_served_when_the_tool_fails_within_the_grace() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = slow_after_first(&calls, Duration::from_secs(3));
    let layer = CacheLayer::new(
        CacheConfig::default()
            .with_ttl(Duration::from_secs(10))
            .with_stale_if_error(Duration::from_secs(20)),
    )
    .expect("valid config");
    layer
        .layer(svc.clone())
        .oneshot(weather())
        .await
        .expect("miss");

    // 25 s in, 5 s of grace left; the tool fails 3 s later, within it.
    advance(Duration::from_secs(25)).await;
    let stale = layer
        .layer(svc.clone())
        .oneshot(weather())
        .await
        .expect("the stale entry, still within its grace");
    assert!(stale.provenance.stale && stale.provenance.cache_hit);
    assert_eq!(stale.output, json!({"n": 1}));
}
