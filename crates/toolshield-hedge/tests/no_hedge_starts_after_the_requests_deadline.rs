//! No hedge starts once the request's deadline has passed (docs/hedging.md, "No hedge
//! after the end"): neither one due to the delay nor one a failure would send at once.
//! On tokio's paused clock.

use std::time::Duration;

use serde_json::json;
use tokio::time::{advance, Instant};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_test::ScriptedTool;
use tower::{Layer, ServiceExt};

fn read(deadline: Instant) -> ToolRequest {
    ToolRequest::new("search", json!({"q": 1}))
        .kind(CallKind::ReadOnly)
        .deadline(deadline)
}

fn fixed(ms: u64, max_hedges: u32) -> HedgeLayer {
    HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(ms)), max_hedges)
}

async fn settle() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

fn hung() -> (Duration, Result<ToolResponse, ToolError>) {
    (
        Duration::from_secs(3_600),
        Ok(ToolResponse::new(json!({"late": true}))),
    )
}

#[tokio::test(start_paused = true)]
async fn a_hedge_due_after_the_deadline_is_not_sent() {
    // Hedges would go at 100, 200 and 300 ms; the deadline is at 150 ms.
    let tool = ScriptedTool::steps([hung(), hung(), hung(), hung()]);
    let layer = fixed(100, 3);
    let deadline = Instant::now() + Duration::from_millis(150);
    let call = tokio::spawn(layer.layer(tool.service()).oneshot(read(deadline)));
    settle().await;
    advance(Duration::from_millis(100)).await;
    settle().await;
    assert_eq!(tool.calls(), 2, "the hedge due before the deadline is sent");
    for _ in 0..5 {
        advance(Duration::from_millis(100)).await;
        settle().await;
    }
    assert_eq!(tool.calls(), 2, "no hedge is sent past the deadline");
    assert_eq!(layer.stats().hedges_sent(), 1);
    call.abort();
}

#[tokio::test(start_paused = true)]
async fn a_failure_after_the_deadline_sends_no_hedge_and_is_the_answer() {
    // The first attempt fails retriably at 200 ms, after the 150 ms deadline: a hedge
    // would go at once, but the call is over.
    let tool = ScriptedTool::steps([
        (
            Duration::from_millis(200),
            Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down")),
        ),
        hung(),
    ]);
    let start = Instant::now();
    let deadline = start + Duration::from_millis(150);
    let err = fixed(1_000, 2)
        .layer(tool.service())
        .oneshot(read(deadline))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert_eq!(tool.calls(), 1);
}
