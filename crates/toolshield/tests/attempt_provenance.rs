//! Which execution a result names: a retry gives each attempt an execution id of its
//! own, and the response's provenance names the attempt that produced the data (the id
//! the tool saw, and logged), not the first attempt that failed. A hedge and a fallback
//! tier are executions of their own, and their results name them. A result served again
//! (a cache hit) keeps the id of the execution that fetched it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use toolshield::fallback::FallbackLayer;

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

[tools.hedged]
kind = "read_only"
hedge = { enabled = true, delay = "100ms", max_hedges = 1 }

[tools.primary]
kind = "read_only"
retry = { max_attempts = 1 }
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

#[tokio::test(start_paused = true)]
async fn a_hedge_is_an_execution_of_its_own_and_its_result_names_it() {
    let shield = shield();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&seen);
    // The first attempt waits for its token (the hedge's win cancels it); the hedge
    // answers at once.
    let tool = service_fn(move |req: ToolRequest| {
        let first = {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push(req.execution_id().to_string());
            log.len() == 1
        };
        async move {
            if first {
                req.attempt_token().cancelled().await;
                return Err(ToolError::cancelled("lost the race"));
            }
            Ok::<_, ToolError>(ToolResponse::new(json!(req.execution_id().to_string())))
        }
    });
    let res = shield
        .wrap("hedged", tool)
        .oneshot(ToolRequest::new("hedged", json!({})))
        .await
        .expect("the hedge answers");
    assert_eq!(res.provenance.hedge_answered_by, Some(2));
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_ne!(seen[0], seen[1], "two executions side by side told one id");
    assert_eq!(named_id(&res).as_deref(), Some(seen[1].as_str()));
}

#[tokio::test(start_paused = true)]
async fn a_shielded_fallback_tier_is_an_execution_of_its_own() {
    let shield = shield();
    let primary_saw: Arc<Mutex<Option<String>>> = Arc::default();
    let saw = Arc::clone(&primary_saw);
    let primary = service_fn(move |req: ToolRequest| {
        *saw.lock().unwrap_or_else(|e| e.into_inner()) = Some(req.execution_id().to_string());
        async { Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down")) }
    });
    let backup = service_fn(|req: ToolRequest| async move {
        Ok::<_, ToolError>(ToolResponse::new(json!(req.execution_id().to_string())))
    });
    // A tier with a shield of its own, as the fallback's documentation advises: its
    // provenance names the tier's execution.
    let chain = FallbackLayer::new().tier("backup", shield.wrap("backup", backup));
    let res = shield
        .wrap_with_fallback("primary", primary, Some(chain))
        .oneshot(ToolRequest::new("primary", json!({})))
        .await
        .expect("the tier answers");
    assert_eq!(res.provenance.tier.as_deref(), Some("backup"));
    let primary_id = primary_saw
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .expect("the primary ran");
    let tier_id = res.output.as_str().map(str::to_owned).expect("an id");
    assert_ne!(tier_id, primary_id, "the primary and its tier told one id");
    assert_eq!(named_id(&res), Some(tier_id));
}

#[tokio::test(start_paused = true)]
async fn a_bare_fallback_tier_is_named_by_the_fallback() {
    let shield = shield();
    let primary = service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
    });
    // No shield of its own: only the fallback sees the tier's request.
    let backup = service_fn(|req: ToolRequest| async move {
        Ok::<_, ToolError>(ToolResponse::new(json!(req.execution_id().to_string())))
    });
    let req = ToolRequest::new("primary", json!({}));
    let entered_with = req.execution_id().to_string();
    let res = shield
        .wrap_with_fallback(
            "primary",
            primary,
            Some(FallbackLayer::new().tier("backup", backup)),
        )
        .oneshot(req)
        .await
        .expect("the tier answers");
    let tier_id = res.output.as_str().map(str::to_owned).expect("an id");
    assert_ne!(tier_id, entered_with);
    assert_eq!(named_id(&res), Some(tier_id));
}
