//! The bounds on waits and on the budget: `max_retry_after`, the minimum time left before
//! a retry, and the budget token of a retry that never started.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{err, ok, read_request};
use tokio::time::Instant;
use toolshield_core::{ErrorKind, ToolError, ToolResponse};
use toolshield_retry::{BackoffStrategy, RetryBudget, RetryConfig, RetryLayer};
use toolshield_test::ScriptedTool;
use tower::{Layer, ServiceExt};

fn rate_limited(wait: Duration) -> Result<ToolResponse, ToolError> {
    Err(ToolError::new(ErrorKind::RateLimited, "too many requests").with_retry_after(wait))
}

fn fixed(wait: Duration) -> BackoffStrategy {
    BackoffStrategy::fixed_range(wait, wait)
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_max_retry_after_ends_the_call_at_once_with_rate_limited() {
    let day = Duration::from_secs(86_400);
    let tool = ScriptedTool::new([rate_limited(day), ok()]);
    let layer = RetryLayer::default();
    let start = Instant::now();
    let e = layer
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO, "no wait at all");
    assert_eq!(e.kind(), ErrorKind::RateLimited);
    assert_eq!(e.retry_after(), Some(day), "the server's wait is kept");
    assert!(
        e.for_model("api").contains("86400"),
        "{}",
        e.for_model("api")
    );
    assert_eq!(tool.calls(), 1, "the tool ran once");
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_date_decades_away_is_not_waited_for() {
    // An HTTP date in year 9999 becomes a wait of decades.
    let decades = Duration::from_secs(30 * 365 * 86_400);
    let tool = ScriptedTool::new([rate_limited(decades), ok()]);
    let start = Instant::now();
    let e = RetryLayer::default()
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(e.kind(), ErrorKind::RateLimited);
    assert_eq!(e.retry_after(), Some(decades));
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_within_max_retry_after_is_waited_and_retried() {
    let tool = ScriptedTool::new([rate_limited(Duration::from_secs(30)), ok()]);
    let start = Instant::now();
    let res = RetryLayer::default()
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 2);
    assert_eq!(tool.calls(), 2);
    let seen = tool.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_secs(30));
    assert_eq!(start.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn max_retry_after_comes_from_the_configuration() {
    let cfg: RetryConfig = serde_json::from_str(r#"{"max_retry_after": "10s"}"#).unwrap();
    assert_eq!(cfg.max_retry_after, Duration::from_secs(10));
    assert_eq!(
        RetryConfig::default().max_retry_after,
        Duration::from_secs(60)
    );
    let layer = RetryLayer::from_config(&cfg).unwrap();
    let tool = ScriptedTool::new([rate_limited(Duration::from_secs(20)), ok()]);
    let e = layer
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap_err();
    assert_eq!(e.retry_after(), Some(Duration::from_secs(20)));
    assert_eq!(tool.calls(), 1);

    let bad = RetryConfig {
        max_retry_after: Duration::from_secs(400 * 86_400),
        min_attempt_time: Duration::from_secs(400 * 86_400),
        ..RetryConfig::default()
    };
    let fields: Vec<String> = bad
        .validate()
        .unwrap_err()
        .problems()
        .iter()
        .map(|p| p.field.clone())
        .collect();
    assert_eq!(fields, ["max_retry_after", "min_attempt_time"]);
}

#[tokio::test(start_paused = true)]
async fn a_backoff_ending_exactly_at_the_deadline_starts_no_attempt() {
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    let layer = RetryLayer::default()
        .with_backoff(fixed(Duration::from_secs(1)))
        .with_min_attempt_time(Duration::ZERO);
    let start = Instant::now();
    let req = read_request().deadline(start + Duration::from_secs(1));
    let e = layer.layer(tool.service()).oneshot(req).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "the last error");
    assert_eq!(start.elapsed(), Duration::ZERO, "returned at once");
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_with_less_than_min_attempt_time_left_is_not_started() {
    // 950 ms of backoff before a 1 s deadline leaves 50 ms: below the default 100 ms.
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    let start = Instant::now();
    let req = read_request().deadline(start + Duration::from_secs(1));
    let e = RetryLayer::default()
        .with_backoff(fixed(Duration::from_millis(950)))
        .layer(tool.service())
        .oneshot(req)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(tool.calls(), 1);

    // 800 ms leaves 200 ms: the retry starts.
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    let start = Instant::now();
    let req = read_request().deadline(start + Duration::from_secs(1));
    let res = RetryLayer::default()
        .with_backoff(fixed(Duration::from_millis(800)))
        .layer(tool.service())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_budget_token_taken_before_a_backoff_is_refunded_when_the_call_is_dropped() {
    // One token, no deposits, one token per second of floor: room for exactly one retry
    // now (and a thousandth of one after the millisecond the first call lives).
    let budget = Arc::new(RetryBudget::new(0.0, 1, 1));
    let layer = RetryLayer::default()
        .with_backoff(fixed(Duration::from_secs(10)))
        .with_budget(Arc::clone(&budget));

    let tool = ScriptedTool::always(ErrorKind::Timeout);
    let svc = layer.layer(tool.service());

    // The first call fails, takes the token and starts a 10 s backoff; it is dropped
    // 1 ms in.
    let dropped = tokio::time::timeout(
        Duration::from_millis(1),
        svc.clone().oneshot(read_request()),
    )
    .await;
    assert!(dropped.is_err(), "the call was still backing off");
    assert_eq!(tool.calls(), 1);

    // The second call can still retry: the token came back.
    let e = svc.oneshot(read_request()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(tool.calls(), 4, "1 + 3 attempts");
}

#[tokio::test(start_paused = true)]
async fn a_budget_token_is_refunded_when_the_call_ends_cancelled_not_only_when_dropped() {
    // One token, no deposits, a floor of one per second: the clock stays still, so no
    // token comes from the floor during the test.
    let budget = Arc::new(RetryBudget::new(0.0, 1, 1));
    let layer = RetryLayer::default()
        .with_backoff(fixed(Duration::from_secs(10)))
        .with_budget(Arc::clone(&budget));
    let tool = ScriptedTool::always(ErrorKind::Timeout);
    let token = tokio_util::sync::CancellationToken::new();
    let req = read_request().cancel_token(token.clone());
    let mut call = std::pin::pin!(layer.layer(tool.service()).oneshot(req));

    // Polled once: the first attempt fails, the retry takes the token and backs off.
    let backing_off = tokio::time::timeout(Duration::ZERO, call.as_mut()).await;
    assert!(backing_off.is_err(), "the call is backing off");
    assert_eq!(tool.calls(), 1);
    assert_eq!(budget.available(), 0, "the retry holds the only token");

    token.cancel();
    let e = call.as_mut().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    assert_eq!(e.attempts(), 1);
    // The finished future is still alive: the token must already be back.
    assert_eq!(
        budget.available(),
        1,
        "the retry never started: its token is back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_budget_token_is_refunded_when_readiness_fails_before_the_retry() {
    let budget = Arc::new(RetryBudget::new(0.0, 1, 1));
    let layer = RetryLayer::default()
        .with_backoff(BackoffStrategy::none())
        .with_budget(Arc::clone(&budget));
    let (mock, mut handle) = tower_test::mock::pair::<toolshield_core::ToolRequest, ToolResponse>();
    let svc = layer.layer(
        mock.map_err(|e: tower::BoxError| match e.downcast::<ToolError>() {
            Ok(e) => *e,
            Err(e) => ToolError::internal(e.to_string()),
        }),
    );
    let mut call = std::pin::pin!(svc.oneshot(read_request()));
    let sent = tokio::time::timeout(Duration::ZERO, call.as_mut()).await;
    assert!(sent.is_err(), "the first attempt is out");
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_error(ToolError::new(ErrorKind::ConnectionFailed, "refused"));
    handle.send_error(ToolError::new(ErrorKind::ConnectionFailed, "pool closed"));
    let e = call.as_mut().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
    assert_eq!(e.attempts(), 1);
    assert_eq!(
        budget.available(),
        1,
        "the retry never started: its token is back"
    );
}
