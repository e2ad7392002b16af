//! The backoff's `cap` plays the part of Polly's `MaxDelay` for the computed waits only
//! (docs/retry.md, "Waits"): a peer's `retry_after` up to `max_retry_after` is waited
//! exactly, even when it is longer than the cap, as Polly leaves a `DelayGenerator`'s
//! delay uncapped by `MaxDelay`; the next computed wait is capped again. On tokio's paused
//! clock.

mod common;

use std::time::Duration;

use common::{err, ok, read_request};
use toolshield_core::{ErrorKind, ToolError};
use toolshield_retry::{BackoffStrategy, Jitter, RetryLayer};
use toolshield_test::{gaps, ScriptedTool};
use tower::{Layer, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_retry_after_above_the_cap_is_waited_whole_and_the_next_backoff_is_capped() {
    let tool = ScriptedTool::new([
        Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503")
            .with_retry_after(Duration::from_secs(20))),
        err(ErrorKind::Timeout),
        ok(),
    ]);
    // Nominal waits 800 ms, 1.6 s, ... capped at 1 s, no jitter.
    let layer = RetryLayer::new(3)
        .without_budget()
        .with_backoff(BackoffStrategy::exponential(
            Duration::from_millis(800),
            2.0,
            Duration::from_secs(1),
            Jitter::None,
        ));
    let res = layer
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 3);
    assert_eq!(
        gaps(&tool.seen()),
        [Duration::from_secs(20), Duration::from_secs(1)]
    );
}
