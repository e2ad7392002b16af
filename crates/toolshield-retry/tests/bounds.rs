//! Unbounded durations: the config rejects them with every other problem, the builders
//! clamp them, and a wait from a backoff or a peer's Retry-After never exceeds
//! `MAX_DURATION` nor panics.

mod common;

use std::time::Duration;

use common::{err, ok, read_request};
use tokio::time::Instant;
use toolshield_core::config::{Problems, MAX_DURATION};
use toolshield_core::{ErrorKind, ToolError};
use toolshield_retry::{BackoffStrategy, Jitter, RetryConfig, RetryLayer};
use toolshield_test::problem_fields;
use toolshield_test::{gaps, ScriptedTool};
use tower::{Layer, ServiceExt};

#[test]
fn validate_reports_every_unbounded_duration_with_its_path() {
    let cfg: RetryConfig = serde_json::from_str(
        r#"{
            "max_attempts": 0,
            "backoff": {"strategy": "exponential", "base": "300000000000years", "factor": 2.0, "cap": "300000000000years"},
            "rate_limit_backoff": "300000000000years"
        }"#,
    )
    .unwrap();
    let err = cfg.validate().unwrap_err();
    assert_eq!(
        problem_fields(&err),
        [
            "max_attempts",
            "backoff.base",
            "backoff.cap",
            "rate_limit_backoff"
        ],
        "{err}"
    );
    assert!(
        err.problems()[1]
            .message
            .contains("longer than the longest duration accepted"),
        "{err}"
    );
    assert!(RetryLayer::from_config(&cfg).is_err());

    for (strategy, expected) in [
        (
            BackoffStrategy::Fixed {
                min: Duration::MAX,
                max: Duration::MAX,
            },
            vec!["b.min", "b.max"],
        ),
        (
            BackoffStrategy::Decorrelated {
                base: Duration::from_secs(1),
                cap: Duration::MAX,
            },
            vec!["b.cap"],
        ),
    ] {
        let mut p = Problems::new();
        strategy.check("b", &mut p);
        let err = p.into_result().unwrap_err();
        assert_eq!(problem_fields(&err), expected, "{err}");
    }
}

#[test]
fn builders_clamp_durations_to_the_longest_accepted() {
    let max = Duration::MAX;
    assert_eq!(
        BackoffStrategy::exponential(max, 2.0, max, Jitter::None),
        BackoffStrategy::Exponential {
            base: MAX_DURATION,
            factor: 2.0,
            cap: MAX_DURATION,
            jitter: Jitter::None
        }
    );
    assert_eq!(
        BackoffStrategy::decorrelated(max, max),
        BackoffStrategy::Decorrelated {
            base: MAX_DURATION,
            cap: MAX_DURATION
        }
    );
    assert_eq!(
        BackoffStrategy::fixed_range(max, max),
        BackoffStrategy::Fixed {
            min: MAX_DURATION,
            max: MAX_DURATION
        }
    );
    let mut p = Problems::new();
    BackoffStrategy::fixed_range(max, max).check("backoff", &mut p);
    assert!(p.is_empty(), "what a builder returns passes validation");
}

#[tokio::test(start_paused = true)]
async fn a_duration_max_backoff_retries_after_the_longest_duration() {
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    let res = RetryLayer::default()
        .without_budget()
        .with_backoff(BackoffStrategy::fixed_range(Duration::MAX, Duration::MAX))
        .layer(tool.service())
        .oneshot(read_request())
        .await;
    assert!(res.is_ok(), "{res:?}");
    assert_eq!(gaps(&tool.seen()), [MAX_DURATION]);
}

#[tokio::test(start_paused = true)]
async fn a_custom_backoff_of_duration_max_is_cut_to_the_longest_duration() {
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    let res = RetryLayer::default()
        .without_budget()
        .with_backoff(|_retry: u32, _previous: Duration, _rng: &mut fastrand::Rng| Duration::MAX)
        .layer(tool.service())
        .oneshot(read_request())
        .await;
    assert!(res.is_ok(), "{res:?}");
    assert_eq!(gaps(&tool.seen()), [MAX_DURATION]);
}

fn rate_limited_for(wait: Duration) -> Result<toolshield_core::ToolResponse, ToolError> {
    Err(ToolError::new(ErrorKind::RateLimited, "slow down").with_retry_after(wait))
}

#[tokio::test(start_paused = true)]
async fn a_huge_retry_after_is_never_waited_and_at_most_the_longest_duration_when_allowed() {
    for wait in [Duration::from_secs(99_999_999_999_999), Duration::MAX] {
        // By default: past `max_retry_after`, the call ends at once with the peer's wait.
        let tool = ScriptedTool::new([rate_limited_for(wait), ok()]);
        let start = Instant::now();
        let e = RetryLayer::default()
            .without_budget()
            .layer(tool.service())
            .oneshot(read_request())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RateLimited);
        assert_eq!(e.retry_after(), Some(wait));
        assert_eq!(tool.calls(), 1);
        assert_eq!(start.elapsed(), Duration::ZERO);

        // `max_retry_after` raised to the limit, no deadline: the retry comes after
        // MAX_DURATION, not after the peer's wait.
        let tool = ScriptedTool::new([rate_limited_for(wait), ok()]);
        let res = RetryLayer::default()
            .without_budget()
            .with_max_retry_after(Duration::MAX)
            .layer(tool.service())
            .oneshot(read_request())
            .await;
        assert!(res.is_ok(), "{res:?}");
        assert_eq!(gaps(&tool.seen()), [MAX_DURATION]);

        // A deadline in 10 s: no retry is started, the call ends at once.
        let tool = ScriptedTool::new([rate_limited_for(wait), ok()]);
        let layer = RetryLayer::default()
            .without_budget()
            .with_max_retry_after(Duration::MAX);
        let start = Instant::now();
        let req = read_request().deadline(start + Duration::from_secs(10));
        let e = layer.layer(tool.service()).oneshot(req).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RateLimited);
        assert_eq!(e.attempts(), 1);
        assert_eq!(tool.calls(), 1);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
