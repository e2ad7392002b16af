//! Which execution a result names: a retry gives each attempt an execution id of its
//! own, and the response's provenance names the attempt that produced the data (the id
//! the tool saw, and logged), not the first attempt that failed. A result served again
//! (a cache hit) keeps the id of the execution that fetched it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield::prelude::*;
use tower::{service_fn, ServiceExt};

const CONFIG: &str = r#"
[tools.flaky]
kind = "read_only"
retry = { max_attempts = 3, backoff = { strategy = "fixed", min = "10ms", max = "10ms" } }

[tools.cached]
kind = "read_only"
cache = { ttl = "60s" }
"#;

fn shield() -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(CONFIG).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Answers with the execution id it was called with; fails the first `failures` calls
/// with a retriable error.
fn echo_id(failures: u32) -> impl toolshield::core::ToolService {
    let calls = Arc::new(AtomicU32::new(0));
    service_fn(move |req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::Relaxed);
        async move {
            if n < failures {
                return Err(ToolError::new(ErrorKind::UpstreamUnavailable, "try again"));
            }
            Ok(ToolResponse::new(json!(req.execution_id().to_string())))
        }
    })
}

fn named_id(resp: &ToolResponse) -> Option<String> {
    resp.provenance.execution_id.map(|id| id.to_string())
}

#[tokio::test(start_paused = true)]
async fn a_retried_result_names_the_attempt_that_produced_it() {
    let shield = shield();
    let req = ToolRequest::new("flaky", json!({"q": 1}));
    let first_attempt = req.execution_id().to_string();
    let resp = shield
        .wrap("flaky", echo_id(2))
        .oneshot(req)
        .await
        .expect("the third attempt succeeds");
    assert_eq!(resp.provenance.attempts, 3);
    let produced_by = resp.output.as_str().map(str::to_owned);
    assert_eq!(named_id(&resp), produced_by, "{:?}", resp.provenance);
    assert_ne!(
        named_id(&resp).as_deref(),
        Some(first_attempt.as_str()),
        "the first attempt failed: it produced nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_result_names_the_call_it_entered_with() {
    let shield = shield();
    let req = ToolRequest::new("flaky", json!({"q": 1}));
    let id = req.execution_id().to_string();
    let resp = shield
        .wrap("flaky", echo_id(0))
        .oneshot(req)
        .await
        .expect("succeeds");
    assert_eq!(resp.provenance.attempts, 1);
    assert_eq!(named_id(&resp).as_deref(), Some(id.as_str()));
    assert_eq!(resp.output, json!(id));
}

#[tokio::test(start_paused = true)]
async fn a_cache_hit_keeps_the_execution_that_fetched_it() {
    let shield = shield();
    let svc = shield.wrap("cached", echo_id(0));
    let fresh = svc
        .clone()
        .oneshot(ToolRequest::new("cached", json!({"q": 1})))
        .await
        .expect("fresh");
    let again = ToolRequest::new("cached", json!({"q": 1}));
    let this_call = again.execution_id().to_string();
    let hit = svc.oneshot(again).await.expect("hit");
    assert!(hit.provenance.cache_hit, "{:?}", hit.provenance);
    assert_eq!(named_id(&fresh), fresh.output.as_str().map(str::to_owned));
    assert_eq!(
        named_id(&hit),
        named_id(&fresh),
        "a hit names the execution that fetched the data"
    );
    assert_ne!(named_id(&hit).as_deref(), Some(this_call.as_str()));
}
