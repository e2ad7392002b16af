//! A retriable failure sends the next hedge at once (as Polly's hedging does), and the
//! hedge after that goes one delay after the hedge just sent, not one delay after the
//! first attempt and not one after the failure's own timer (docs/hedging.md, "Delay":
//! "every further hedge `delay` after the previous one"). On tokio's paused clock.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_test::{gaps, ScriptedTool};
use tower::{Layer, ServiceExt};

fn read() -> ToolRequest {
    ToolRequest::new("search", json!({"q": 1})).kind(CallKind::ReadOnly)
}

#[tokio::test(start_paused = true)]
async fn the_schedule_restarts_from_the_hedge_a_failure_sent() {
    // First attempt fails at 10 ms; the hedge sent then hangs; the next goes at 110 ms and
    // the last at 210 ms, which answers 5 ms later.
    let slow = || {
        (
            Duration::from_secs(10),
            Ok(ToolResponse::new(json!({"by": "slow"}))),
        )
    };
    let tool = ScriptedTool::steps([
        (
            Duration::from_millis(10),
            Err(ToolError::new(ErrorKind::ConnectionFailed, "refused")),
        ),
        slow(),
        slow(),
        (
            Duration::from_millis(5),
            Ok(ToolResponse::new(json!({"by": "last"}))),
        ),
    ]);
    let start = Instant::now();
    let res = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 3)
        .layer(tool.service())
        .oneshot(read())
        .await
        .unwrap();
    assert_eq!(res.output, json!({"by": "last"}));
    assert_eq!(
        gaps(&tool.seen()),
        [
            Duration::from_millis(10),
            Duration::from_millis(100),
            Duration::from_millis(100)
        ]
    );
    assert_eq!(start.elapsed(), Duration::from_millis(215));
    assert_eq!(res.provenance.hedge_answered_by, Some(4));
    assert_eq!(res.provenance.hedges_sent, Some(4));
}

#[tokio::test(start_paused = true)]
async fn every_attempt_failing_fast_makes_exactly_one_plus_max_hedges_calls_at_once() {
    // Polly's MaxHedgedAttempts counts the extra calls: 2 hedges, 3 calls in all, each
    // sent as the previous one fails, none waiting for the delay.
    let tool = ScriptedTool::always(ErrorKind::UpstreamUnavailable);
    let start = Instant::now();
    let err = HedgeLayer::new(HedgeDelay::fixed(Duration::from_secs(5)), 2)
        .layer(tool.service())
        .oneshot(read())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(tool.calls(), 3);
    assert_eq!(start.elapsed(), Duration::ZERO);
}
