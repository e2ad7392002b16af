//! Progress in provenance: the count of reports and the last message, absent from JSON
//! for a tool that reports nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_core::{ToolError, ToolRequest, ToolResponse, MAX_PROGRESS_MESSAGE};
use toolshield_provenance::ProvenanceLayer;
use toolshield_timeout::TimeoutLayer;
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[tokio::test(start_paused = true)]
async fn provenance_has_the_count_and_the_last_message() {
    let tool = service_fn(|req: ToolRequest| async move {
        for (i, msg) in [Some("fetching"), None, Some("parsing")]
            .into_iter()
            .enumerate()
        {
            tokio::time::sleep(Duration::from_secs(4)).await;
            req.progress().report(i as f64, Some(3.0), msg);
        }
        Ok::<_, ToolError>(ToolResponse::new(json!({"pages": 3})))
    });
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(TimeoutLayer::new(Duration::from_secs(60)).idle(Duration::from_secs(5)))
        .service(tool);
    let res = svc
        .oneshot(ToolRequest::new("crawl", json!({})))
        .await
        .unwrap();
    assert_eq!(res.provenance.progress_reports, 3);
    assert_eq!(res.provenance.progress_message.as_deref(), Some("parsing"));
    let value = serde_json::to_value(&res.provenance).unwrap();
    assert_eq!(value["progressReports"], json!(3));
    assert_eq!(value["progressMessage"], json!("parsing"));
}

#[tokio::test]
async fn a_tool_without_progress_leaves_the_json_unchanged() {
    let tool =
        service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!(1))) });
    let res = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .service(tool)
        .oneshot(ToolRequest::new("quick", json!({})))
        .await
        .unwrap();
    assert_eq!(res.provenance.progress_reports, 0);
    assert_eq!(res.provenance.progress_message, None);
    let value = serde_json::to_value(&res.provenance).unwrap();
    let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
    assert!(
        !keys.iter().any(|k| k.starts_with("progress")),
        "no progress keys: {keys:?}"
    );
    // and an older record without the fields still reads
    let back: toolshield_core::Provenance = serde_json::from_value(value).unwrap();
    assert_eq!(back.progress_reports, 0);
}

#[tokio::test]
async fn the_callers_callback_and_provenance_count_the_same_reports() {
    let tool = service_fn(|req: ToolRequest| async move {
        let huge = "x".repeat(10_000);
        req.progress().heartbeat();
        req.progress().report(None, None, Some(&huge));
        Ok::<_, ToolError>(ToolResponse::new(json!(1)))
    });
    let seen = Arc::new(AtomicU64::new(0));
    let longest = Arc::new(AtomicU64::new(0));
    let (count, len) = (Arc::clone(&seen), Arc::clone(&longest));
    let req = ToolRequest::new("t", json!({})).on_progress(move |e| {
        count.fetch_add(1, Ordering::SeqCst);
        len.fetch_max(e.message.map_or(0, str::len) as u64, Ordering::SeqCst);
    });
    let res = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .service(tool)
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    assert_eq!(res.provenance.progress_reports, 2);
    // The callback sees the message whole; provenance keeps a bounded copy.
    assert_eq!(longest.load(Ordering::SeqCst), 10_000);
    assert_eq!(
        res.provenance.progress_message.as_deref().map(str::len),
        Some(MAX_PROGRESS_MESSAGE)
    );
}
