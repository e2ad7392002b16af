//! What the percentile delay learns from (docs/hedging.md, "Percentile delay"): the
//! latencies of recent *successful* calls, and of each only the attempt that answered.
//! Failures, however fast, teach it nothing (a burst of instant `NOT_FOUND`s must not
//! make every later call hedge at once), and a call won by a hedge records the hedge's
//! own latency. On tokio's paused clock.

use std::time::Duration;

use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_test::ScriptedTool;
use tower::{Layer, ServiceExt};

fn read() -> ToolRequest {
    ToolRequest::new("search", json!({"q": 1})).kind(CallKind::ReadOnly)
}

fn percentile_layer() -> HedgeLayer {
    HedgeLayer::new(
        HedgeDelay::percentile(50.0, Duration::from_millis(1), Duration::from_secs(2)),
        1,
    )
}

#[tokio::test(start_paused = true)]
async fn fast_failures_leave_the_delay_at_its_maximum() {
    let layer = percentile_layer();
    // Non-retriable failures after 1 ms, and retriable ones whose hedge fails too.
    let tool = ScriptedTool::steps((0..200).map(|i| {
        let kind = if i % 2 == 0 {
            ErrorKind::NotFound
        } else {
            ErrorKind::UpstreamUnavailable
        };
        (
            Duration::from_millis(1),
            Err(ToolError::new(kind, "scripted failure")),
        )
    }));
    let svc = layer.layer(tool.service());
    for _ in 0..60 {
        assert!(svc.clone().oneshot(read()).await.is_err());
    }
    let histogram = layer.delay().histogram().expect("a percentile delay");
    assert_eq!(histogram.len(), 0, "no failure is recorded");
    assert_eq!(layer.delay().current(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_call_won_by_a_hedge_records_the_hedges_own_latency() {
    let layer = percentile_layer();
    // Every call: a first attempt that would take 10 s, and a hedge (sent after the 2 s
    // maximum) that answers 30 ms after it was sent.
    let tool = ScriptedTool::steps((0..40).flat_map(|_| {
        [
            (
                Duration::from_secs(10),
                Ok(ToolResponse::new(json!({"by": 1}))),
            ),
            (
                Duration::from_millis(30),
                Ok(ToolResponse::new(json!({"by": 2}))),
            ),
        ]
    }));
    let svc = layer.layer(tool.service());
    for _ in 0..20 {
        let res = svc.clone().oneshot(read()).await.unwrap();
        assert_eq!(res.output, json!({"by": 2}));
    }
    let histogram = layer.delay().histogram().expect("a percentile delay");
    assert_eq!(histogram.len(), 20);
    let delay = layer.delay().current();
    assert!(
        delay >= Duration::from_millis(30) && delay < Duration::from_millis(34),
        "the hedge's 30 ms, not the call's 2.03 s: {delay:?}"
    );
}
