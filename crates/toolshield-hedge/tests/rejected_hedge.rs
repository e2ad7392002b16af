//! A hedge that a circuit breaker inside refuses (`CIRCUIT_OPEN`) never ends the call:
//! the attempt already admitted keeps running and its answer is the call's.
//!
//! With `retry > hedge > breaker`, a half-open breaker admits one probe: the first
//! attempt. A hedge sent while the probe runs is refused at once. Ending the call on that
//! refusal would cancel the probe, so a tool slower than the hedge delay could never
//! close its breaker again.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_contract::CallKind;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_test::ScriptedTool;
use tower::{Layer, ServiceExt};

fn read() -> ToolRequest {
    ToolRequest::new("search".to_owned(), json!({"q": 1})).kind(CallKind::ReadOnly)
}

fn open() -> Result<ToolResponse, ToolError> {
    Err(ToolError::new(
        ErrorKind::CircuitOpen,
        "circuit open for tool `search`",
    ))
}

#[tokio::test(start_paused = true)]
async fn a_hedge_refused_by_an_open_breaker_leaves_the_first_attempt_running() {
    let tool = ScriptedTool::steps([
        (
            Duration::from_millis(300),
            Ok(ToolResponse::new(json!("first"))),
        ),
        (Duration::ZERO, open()),
    ]);
    let layer = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 2);
    let start = Instant::now();
    let res = layer
        .layer(tool.service())
        .oneshot(read())
        .await
        .expect("the first attempt answers");
    assert_eq!(res.output, json!("first"));
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    let seen = tool.seen();
    // The refusal says the breaker is open: no further hedge is sent into it.
    assert_eq!(seen.len(), 2);
    assert!(!seen[0].attempt_token.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_refused_hedge_is_the_answer_only_when_nothing_else_answers() {
    let tool = ScriptedTool::steps([
        (
            Duration::from_millis(300),
            Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down")),
        ),
        (Duration::ZERO, open()),
    ]);
    let layer = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 1);
    let start = Instant::now();
    let err = layer
        .layer(tool.service())
        .oneshot(read())
        .await
        .unwrap_err();
    // The last failure, once every attempt has ended.
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_refused_by_an_open_breaker_ends_the_call_at_once() {
    let tool = ScriptedTool::steps([(Duration::ZERO, open())]);
    let layer = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 2);
    let start = Instant::now();
    let err = layer
        .layer(tool.service())
        .oneshot(read())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(tool.calls(), 1);
}

fn refused(kind: ErrorKind) -> Result<ToolResponse, ToolError> {
    Err(ToolError::new(kind, "refused before the tool ran"))
}

/// A bulkhead or a rate limiter inside refuses a hedge at once (`OVERLOADED`,
/// `RATE_LIMITED`): the copies after it would be refused the same way, so no further
/// hedge is sent into it and no more budget is spent on it; the first attempt keeps
/// running and answers.
#[tokio::test(start_paused = true)]
async fn a_hedge_refused_by_a_full_bulkhead_or_a_rate_limiter_stops_hedging() {
    for kind in [ErrorKind::Overloaded, ErrorKind::RateLimited] {
        let tool = ScriptedTool::steps([
            (
                Duration::from_millis(300),
                Ok(ToolResponse::new(json!("first"))),
            ),
            (Duration::ZERO, refused(kind)),
            (Duration::ZERO, refused(kind)),
            (Duration::ZERO, refused(kind)),
        ]);
        let layer = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 3);
        let start = Instant::now();
        let res = layer
            .layer(tool.service())
            .oneshot(read())
            .await
            .expect("the first attempt answers");
        assert_eq!(res.output, json!("first"), "{kind:?}");
        assert_eq!(start.elapsed(), Duration::from_millis(300), "{kind:?}");
        let seen = tool.seen();
        assert_eq!(
            seen.len(),
            2,
            "{kind:?}: one hedge, none repeated into the refusal"
        );
        assert!(!seen[0].attempt_token.is_cancelled(), "{kind:?}");
        assert_eq!(layer.stats().hedges_sent(), 1, "{kind:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_refused_by_a_limiter_is_not_hedged_into_it() {
    for kind in [ErrorKind::Overloaded, ErrorKind::RateLimited] {
        let tool = ScriptedTool::steps([(Duration::ZERO, refused(kind))]);
        let layer = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 2);
        let err = layer
            .layer(tool.service())
            .oneshot(read())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind);
        assert_eq!(tool.calls(), 1, "{kind:?}");
    }
}
