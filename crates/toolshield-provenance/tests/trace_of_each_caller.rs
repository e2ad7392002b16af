//! A trace id belongs to the call that carried it: a result recorded for one caller and
//! served again to another (a cache hit, an idempotent replay) names the trace of the
//! caller it is served to, never the one it was recorded for, while keeping its origin
//! (`fetched_at`, attempts, execution id).

use std::sync::{Arc, Mutex};

use chrono::{TimeZone, Utc};
use serde_json::json;
use toolshield_core::{ToolError, ToolRequest, ToolResponse, ToolResult};
use toolshield_provenance::ProvenanceLayer;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

/// What the provenance layer wraps here: a store in front of the tool (as a cache or an
/// idempotency layer is). The first call runs the tool, whose response names the trace
/// it ran in (as a stack of its own inside would stamp it), and is recorded; every later
/// call is answered from the record, flagged `cache_hit` or `replayed`.
fn recording_store(
    replay: bool,
) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send> + Clone {
    let record: Arc<Mutex<Option<ToolResponse>>> = Arc::default();
    service_fn(move |req: ToolRequest| {
        let record = Arc::clone(&record);
        async move {
            let mut kept = record.lock().unwrap();
            if let Some(stored) = kept.as_ref() {
                let mut res = stored.clone();
                if replay {
                    res.provenance.replayed = true;
                } else {
                    res.provenance.cache_hit = true;
                }
                return Ok::<_, ToolError>(res);
            }
            let mut res = ToolResponse::new(json!({"temp": 21}));
            res.provenance.fetched_at = Some(Utc.with_ymd_and_hms(2025, 1, 15, 8, 0, 0).unwrap());
            res.provenance.attempts = 2;
            res.provenance.execution_id = Some(req.execution_id());
            res.provenance.trace_id = req.meta().trace_id.clone();
            *kept = Some(res.clone());
            Ok(res)
        }
    })
}

async fn check_trace_isolation(replay: bool) {
    let svc = ServiceBuilder::new()
        .layer(ProvenanceLayer::new())
        .service(recording_store(replay));
    let first = ToolRequest::new("weather", json!({"city": "Paris"})).trace_id("trace-of-alice");
    let alice_execution = first.execution_id();
    let a = svc.clone().oneshot(first).await.unwrap();
    assert_eq!(a.provenance.trace_id.as_deref(), Some("trace-of-alice"));

    // Bob, with a trace of his own: his trace, and the record's origin.
    let b = svc
        .clone()
        .oneshot(ToolRequest::new("weather", json!({"city": "Paris"})).trace_id("trace-of-bob"))
        .await
        .unwrap();
    let p = &b.provenance;
    assert_eq!(
        p.trace_id.as_deref(),
        Some("trace-of-bob"),
        "replay={replay}"
    );
    assert_eq!(p.fetched_at, a.provenance.fetched_at);
    assert_eq!(p.attempts, 2);
    assert_eq!(p.execution_id, Some(alice_execution));

    // Carol, without a trace: no trace at all, and certainly not Alice's.
    let c = svc
        .clone()
        .oneshot(ToolRequest::new("weather", json!({"city": "Paris"})))
        .await
        .unwrap();
    assert_eq!(c.provenance.trace_id, None, "replay={replay}");
    let envelope = serde_json::to_value(ToolResult::from(Ok::<_, ToolError>(c))).unwrap();
    assert!(
        !envelope.to_string().contains("trace-of-alice"),
        "{envelope}"
    );
    // The original fetch time, as RFC 3339 in UTC.
    assert_eq!(envelope["provenance"]["fetchedAt"], "2025-01-15T08:00:00Z");
    assert_eq!(
        envelope["fromCache"], true,
        "served from a cache or a dedupe record"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cache_hit_names_the_trace_of_the_caller_it_is_served_to() {
    check_trace_isolation(false).await;
}

#[tokio::test(start_paused = true)]
async fn a_replay_names_the_trace_of_the_caller_it_is_served_to() {
    check_trace_isolation(true).await;
}
