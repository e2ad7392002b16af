//! Provenance on successes (fresh, cached-style, replayed, slow) and on errors.

use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::json;
use toolshield_core::{
    payload_digest, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolResult, ToolStatus,
};
use toolshield_provenance::{ProvenanceConfig, ProvenanceLayer};
use toolshield_timeout::TimeoutLayer;
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[tokio::test(start_paused = true)]
async fn fresh_success_gets_every_field() {
    let tool = service_fn(|_req: ToolRequest| async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        Ok::<_, ToolError>(ToolResponse::new(json!({"b": 2, "a": 1})))
    });
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .service(tool);
    let req = ToolRequest::new("weather", json!({"city": "Paris"})).trace_id("t-1");
    let execution_id = req.execution_id();
    let before = Utc::now();
    let res = svc.oneshot(req).await.unwrap();
    let p = &res.provenance;
    assert_eq!(p.source.as_deref(), Some("weather"));
    assert_eq!(p.tool.as_deref(), Some("weather"));
    assert!(p.fetched_at.unwrap() >= before);
    assert!(!p.cache_hit && !p.replayed && !p.stale && !p.slow);
    assert_eq!(p.attempts, 1);
    assert_eq!(p.execution_id, Some(execution_id));
    assert_eq!(p.trace_id.as_deref(), Some("t-1"));
    assert_eq!(p.duration, Some(Duration::from_millis(250)));
    // The digest is of the canonical form: key order does not matter.
    assert_eq!(
        p.response_digest,
        Some(payload_digest(&json!({"a": 1, "b": 2})).unwrap())
    );
}

#[tokio::test(start_paused = true)]
async fn cache_hits_and_replays_keep_their_origin() {
    let original = Utc.with_ymd_and_hms(2025, 1, 15, 8, 0, 0).unwrap();
    let tool = service_fn(move |req: ToolRequest| async move {
        let mut res = ToolResponse::new(json!({"temp": 21}));
        res.provenance.fetched_at = Some(original);
        res.provenance.attempts = 2;
        res.provenance.source = Some("open-meteo.com".into());
        if req.tool() == "weather" {
            res.provenance.cache_hit = true;
        } else {
            res.provenance.replayed = true;
        }
        Ok::<_, ToolError>(res)
    });
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new().source("ignored-default"))
        .service(tool);
    for tool in ["weather", "payments"] {
        let res = svc
            .clone()
            .oneshot(ToolRequest::new(tool, json!({})))
            .await
            .unwrap();
        let p = &res.provenance;
        assert_eq!(p.fetched_at, Some(original), "{tool}");
        assert_eq!(p.attempts, 2, "{tool}");
        assert_eq!(p.source.as_deref(), Some("open-meteo.com"), "{tool}");
        assert_eq!(p.cache_hit, tool == "weather");
        assert_eq!(p.replayed, tool == "payments");
        assert_eq!(p.duration, Some(Duration::ZERO));
        assert!(p.response_digest.is_some());
    }
}

#[tokio::test(start_paused = true)]
async fn configured_sources_and_slow_marks() {
    let config: ProvenanceConfig = serde_json::from_value(
        json!({"source": "tools", "sources": {"search": "duckduckgo"}, "digest": false}),
    )
    .unwrap();
    let tool = service_fn(|_req: ToolRequest| async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("x")))
    });
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::from_config(config).unwrap())
        .layer(TimeoutLayer::new(Duration::from_secs(10)).soft_threshold(Duration::from_secs(2)))
        .service(tool);
    let search = svc
        .clone()
        .oneshot(ToolRequest::new("search", json!({})))
        .await
        .unwrap();
    assert_eq!(search.provenance.source.as_deref(), Some("duckduckgo"));
    assert!(search.provenance.slow);
    assert_eq!(search.provenance.response_digest, None);
    let other = svc
        .oneshot(ToolRequest::new("maps", json!({})))
        .await
        .unwrap();
    assert_eq!(other.provenance.source.as_deref(), Some("tools"));
}

#[test]
fn bad_config_lists_every_problem() {
    let config: ProvenanceConfig =
        serde_json::from_value(json!({"source": " ", "sources": {"search": ""}})).unwrap();
    let err = ProvenanceLayer::from_config(config).unwrap_err();
    assert_eq!(err.problems().len(), 2, "{err}");
    assert!(serde_json::from_value::<ProvenanceConfig>(json!({"sourse": "x"})).is_err());
}

#[tokio::test(start_paused = true)]
async fn errors_carry_attempts_and_duration_into_tool_result() {
    let tool = service_fn(|_req: ToolRequest| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("late")))
    });
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .layer(TimeoutLayer::new(Duration::from_millis(1500)))
        .service(tool);
    let err = svc
        .oneshot(ToolRequest::new("slow", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.elapsed(), Some(Duration::from_millis(1500)));
    let result = ToolResult::from(err);
    assert_eq!(result.status, ToolStatus::Timeout);
    assert_eq!(result.duration_ms, 1500);
    assert_eq!(result.provenance.as_ref().map(|p| p.attempts), Some(1));

    // A retry layer's count is kept.
    let failing = service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(
            ToolError::new(ErrorKind::ConnectionFailed, "refused").with_attempts(3),
        )
    });
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .service(failing);
    let err = svc
        .oneshot(ToolRequest::new("db", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 3);
}
