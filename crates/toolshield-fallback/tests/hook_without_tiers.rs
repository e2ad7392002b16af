//! A chain with an escalation hook and no tiers: the hook is asked only once a tier took
//! a failure, so it is never asked here; the primary's error goes back as it was, and
//! building such a chain logs a warning instead of failing silently.
//!
//! Alone in its test binary: `tracing` caches whether a callsite is enabled, process-wide,
//! and a layer built on another test thread with no subscriber could race this test's
//! scoped subscriber for that decision.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_fallback::{Escalation, FallbackLayer};
use tower::{service_fn, Layer, ServiceExt};

#[test]
fn a_hook_without_tiers_is_never_asked_and_building_it_warns() {
    let logs = toolshield_test::LogCapture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let asked = Arc::new(AtomicU32::new(0));
    let a = Arc::clone(&asked);
    let primary = service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
    });
    let svc = tracing::subscriber::with_default(subscriber, || {
        FallbackLayer::new()
            .escalate(move |_failure| {
                a.fetch_add(1, Ordering::SeqCst);
                async { Escalation::Skip(ToolResponse::new(json!("substitute"))) }
            })
            .layer(primary)
    });
    let text = logs.text();
    assert!(text.contains("WARN"), "{text}");
    assert!(text.contains("never asks the hook"), "{text}");

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let e = rt
        .block_on(svc.oneshot(ToolRequest::new("search", json!({}))))
        .expect_err("no tier, no substitute");
    assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable, "as it was: {e:?}");
    assert_eq!(asked.load(Ordering::SeqCst), 0);
}
