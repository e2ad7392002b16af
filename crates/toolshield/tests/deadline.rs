//! The call deadline of the shield's stack cuts a call and cancels the attempt token the
//! tool was given, in the first attempt and in a retried one (the deadline leaves the
//! guarding of attempts to the attempt timeout inside it) and in a fallback tier (which
//! runs outside the attempt timeout, so there the deadline guards it); a tier called
//! after a timed-out attempt starts with a live token of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_core::CancellationToken;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, Service, ServiceExt};

const CONFIG: &str = r#"
[tools.slow]
kind = "read_only"
timeout = { attempt = "10s", total = "10s" }
retry = { max_attempts = 3, backoff = { strategy = "none" }, budget = { enabled = false } }
"#;

/// A tool whose attempts before `hang_from` fail at once and whose later ones never
/// answer; it keeps every attempt token it was given.
fn tool(
    hang_from: usize,
    tokens: Arc<Mutex<Vec<CancellationToken>>>,
) -> impl toolshield_core::ToolService {
    service_fn(move |req: ToolRequest| {
        let n = {
            let mut seen = tokens.lock().unwrap();
            seen.push(req.attempt_token().clone());
            seen.len()
        };
        async move {
            if n < hang_from {
                return Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"));
            }
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }
    })
}

/// Calls `svc` (the tool `slow`) and checks that the call is cut with `TIMEOUT` at the
/// 10 s deadline.
async fn fails_at_the_deadline<S>(svc: S)
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    let started = tokio::time::Instant::now();
    let req = ToolRequest::new("slow", json!({})).kind(CallKind::ReadOnly);
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "cut at the deadline"
    );
}

/// The tool `slow` of `config` around `primary`, with `tier` as its one fallback tier.
fn slow_with_tier(
    config: &str,
    primary: impl toolshield_core::ToolService,
    tier: impl toolshield_core::ToolService,
) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError> {
    let shield = Shield::from_config(ShieldConfig::from_toml_str(config).unwrap()).unwrap();
    let chain = toolshield_fallback::FallbackLayer::new().tier("backup", tier);
    shield.wrap_with_fallback("slow", primary, Some(chain))
}

async fn cut_at_attempt(hang_from: usize) {
    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG).unwrap()).unwrap();
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let svc = shield.wrap("slow", tool(hang_from, Arc::clone(&tokens)));
    fails_at_the_deadline(svc).await;
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), hang_from, "attempts made");
    let last = tokens.last().unwrap();
    assert!(
        last.is_cancelled(),
        "the attempt cut by the deadline is cancelled"
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_cut_by_the_call_deadline_sees_its_token_cancelled() {
    cut_at_attempt(1).await;
}

#[tokio::test(start_paused = true)]
async fn a_retried_attempt_cut_by_the_call_deadline_sees_its_token_cancelled() {
    cut_at_attempt(2).await;
}

#[tokio::test(start_paused = true)]
async fn a_fallback_tier_cut_by_the_call_deadline_sees_its_token_cancelled() {
    // A tier runs outside the attempt timeout: with tiers, the deadline guards the token.
    const ONE_ATTEMPT: &str = r#"
    [tools.slow]
    kind = "read_only"
    timeout = { attempt = "10s", total = "10s" }
    retry = { max_attempts = 1 }
    "#;
    let tier_tokens = Arc::new(Mutex::new(Vec::new()));
    // The primary fails at once; the tier never answers.
    let primary = tool(usize::MAX, Arc::new(Mutex::new(Vec::new())));
    let tier = tool(1, Arc::clone(&tier_tokens));
    fails_at_the_deadline(slow_with_tier(ONE_ATTEMPT, primary, tier)).await;
    let tokens = tier_tokens.lock().unwrap();
    assert_eq!(tokens.len(), 1, "the tier was called");
    assert!(
        tokens[0].is_cancelled(),
        "the tier cut by the deadline is cancelled"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fallback_tier_after_a_timed_out_attempt_starts_with_a_live_attempt_token() {
    // The primary's only attempt is cut by its attempt timeout, which cancels that
    // attempt's token; the tier is another attempt and must not inherit it.
    const TIMED_OUT: &str = r#"
    [tools.slow]
    kind = "read_only"
    timeout = { attempt = "1s", total = "10s" }
    retry = { max_attempts = 1 }
    "#;
    let live_at_call = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&live_at_call);
    let backup = service_fn(move |req: ToolRequest| {
        *seen.lock().unwrap() = Some(!req.attempt_token().is_cancelled());
        async { Ok::<_, ToolError>(ToolResponse::new(json!("from the tier"))) }
    });
    let primary = tool(1, Arc::new(Mutex::new(Vec::new())));
    let svc = slow_with_tier(TIMED_OUT, primary, backup);
    let req = ToolRequest::new("slow", json!({})).kind(CallKind::ReadOnly);
    let res = svc.oneshot(req).await.expect("the tier answers");
    assert_eq!(res.output, json!("from the tier"));
    assert_eq!(
        *live_at_call.lock().unwrap(),
        Some(true),
        "the tier's attempt token was live when it was called"
    );
}
