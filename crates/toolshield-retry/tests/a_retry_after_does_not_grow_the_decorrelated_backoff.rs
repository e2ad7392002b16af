//! Decorrelated jitter grows each wait from the backoff's own previous delay
//! (`uniform[base, 3 × previous]`). A wait a peer asked for with `Retry-After` is the
//! peer's, not the backoff's: it must not become the "previous" delay, or one 20 s
//! `Retry-After` would let the next computed wait reach a minute. Polly keeps its jitter
//! state apart from a `DelayGenerator`'s delay the same way. On tokio's paused clock.

mod common;

use std::time::Duration;

use common::{err, ok, read_request};
use toolshield_core::{ErrorKind, ToolError};
use toolshield_retry::{BackoffStrategy, RetryLayer};
use toolshield_test::{gaps, ScriptedTool};
use tower::{Layer, ServiceExt};

const BASE: Duration = Duration::from_millis(100);

/// The gaps between the three attempts of one call through a retry layer with
/// decorrelated jitter from `BASE`, the tool failing twice as `script` says, then
/// answering.
async fn gaps_of(script: [Result<toolshield_core::ToolResponse, ToolError>; 3]) -> Vec<Duration> {
    let tool = ScriptedTool::new(script);
    let layer = RetryLayer::new(3)
        .without_budget()
        .with_backoff(BackoffStrategy::decorrelated(
            BASE,
            Duration::from_secs(120),
        ));
    let res = layer
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 3);
    gaps(&tool.seen())
}

#[tokio::test(start_paused = true)]
async fn the_wait_after_a_retry_after_grows_from_the_base_not_from_the_peers_wait() {
    // Twenty calls: with the Retry-After taken as the previous delay, the computed wait
    // would be uniform over [100 ms, 60 s], and at most 300 ms once in 200 on average.
    for _ in 0..20 {
        let gaps = gaps_of([
            Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503")
                .with_retry_after(Duration::from_secs(20))),
            err(ErrorKind::ConnectionFailed),
            ok(),
        ])
        .await;
        assert_eq!(
            gaps[0],
            Duration::from_secs(20),
            "the Retry-After is waited whole"
        );
        assert!(
            gaps[1] >= BASE && gaps[1] <= BASE * 3,
            "the first computed wait is drawn from [base, 3 x base], got {:?}",
            gaps[1]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_computed_wait_still_grows_the_next_one() {
    // Without a Retry-After in between, decorrelated jitter does grow: over many calls
    // some second wait exceeds 3 x base, which only a grown "previous" allows.
    let mut grew = false;
    for _ in 0..50 {
        let gaps = gaps_of([
            err(ErrorKind::ConnectionFailed),
            err(ErrorKind::ConnectionFailed),
            ok(),
        ])
        .await;
        assert!(gaps[0] >= BASE && gaps[0] <= BASE * 3);
        assert!(gaps[1] >= BASE && gaps[1] <= gaps[0] * 3);
        grew |= gaps[1] > BASE * 3;
    }
    assert!(grew, "the second computed wait never grew past 3 x base");
}
