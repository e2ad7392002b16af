//! How many attempts a call makes, how long it waits between them, and when it stops,
//! as documented in `docs/retry.md` (tokio's paused clock).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ok, read_request};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest};
use toolshield_retry::{
    BackoffStrategy, BudgetConfig, Jitter, RetryBudget, RetryConfig, RetryLayer,
};
use toolshield_test::{gaps, ScriptedTool};
use tower::{Layer, Service, ServiceExt};

fn no_wait(max_attempts: u32) -> RetryLayer {
    RetryLayer::from_config(&RetryConfig {
        max_attempts,
        backoff: BackoffStrategy::none(),
        ..Default::default()
    })
    .unwrap()
    .without_budget()
}

#[tokio::test(start_paused = true)]
async fn n_retries_make_n_plus_one_calls_and_one_attempt_makes_one_call() {
    for retries in 0..6u32 {
        let tool = ScriptedTool::always(ErrorKind::ConnectionFailed);
        let e = no_wait(retries + 1)
            .layer(tool.service())
            .oneshot(read_request())
            .await
            .unwrap_err();
        assert_eq!(tool.calls(), retries as usize + 1, "{retries} retries");
        assert_eq!(e.attempts(), retries + 1);
        assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
    }
    // `RetryLayer::new(0)` is one attempt, never none.
    let tool = ScriptedTool::always(ErrorKind::ConnectionFailed);
    let _ = RetryLayer::new(0)
        .layer(tool.service())
        .oneshot(read_request())
        .await;
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_of_zero_retries_at_once() {
    let tool = ScriptedTool::new([
        Err(ToolError::rate_limited("429", Some(Duration::ZERO))),
        ok(),
    ]);
    let start = Instant::now();
    let res = RetryLayer::default()
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 2);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "no 30 s default for an explicit 0"
    );
}

#[tokio::test(start_paused = true)]
async fn a_503_with_retry_after_waits_that_long_instead_of_the_backoff() {
    let tool = ScriptedTool::new([
        Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503")
            .with_retry_after(Duration::from_secs(4))),
        ok(),
    ]);
    let res = RetryLayer::default()
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 2);
    assert_eq!(gaps(&tool.seen()), [Duration::from_secs(4)]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_the_time_left_ends_the_call_at_once_with_its_error() {
    for kind in [ErrorKind::RateLimited, ErrorKind::UpstreamUnavailable] {
        let tool = ScriptedTool::new([
            Err(ToolError::new(kind, "busy").with_retry_after(Duration::from_secs(20))),
            ok(),
        ]);
        let start = Instant::now();
        let req = read_request().deadline(start + Duration::from_secs(10));
        let e = RetryLayer::default()
            .layer(tool.service())
            .oneshot(req)
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            kind,
            "the error that asked for the wait, not TIMEOUT"
        );
        assert_eq!(e.retry_after(), Some(Duration::from_secs(20)));
        assert_eq!(start.elapsed(), Duration::ZERO, "no sleep");
        assert_eq!(tool.calls(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn no_backoff_sleeps_past_the_deadline() {
    // Fixed 3 s waits, 7 s deadline: attempts at 0 s, 3 s and 6 s (1 s left); a fourth
    // would start at 9 s, past the deadline, so the call ends when the third one fails.
    let tool = ScriptedTool::always(ErrorKind::UpstreamUnavailable);
    let layer = RetryLayer::from_config(&RetryConfig {
        max_attempts: 10,
        backoff: BackoffStrategy::fixed_range(Duration::from_secs(3), Duration::from_secs(3)),
        ..Default::default()
    })
    .unwrap();
    let start = Instant::now();
    let req = read_request().deadline(start + Duration::from_secs(7));
    let e = layer.layer(tool.service()).oneshot(req).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(tool.calls(), 3);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(6),
        "ended when the last attempt failed"
    );
}

#[tokio::test(start_paused = true)]
async fn exponential_waits_grow_by_the_factor_and_stop_at_the_cap_even_after_64_attempts() {
    let tool = ScriptedTool::always(ErrorKind::ConnectionFailed);
    let layer = RetryLayer::from_config(&RetryConfig {
        max_attempts: 80,
        backoff: BackoffStrategy::exponential(
            Duration::from_millis(100),
            10.0,
            Duration::from_secs(2),
            Jitter::None,
        ),
        ..Default::default()
    })
    .unwrap()
    .without_budget();
    let e = layer
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap_err();
    assert_eq!(e.attempts(), 80);
    let waits = gaps(&tool.seen());
    assert_eq!(waits.len(), 79);
    assert_eq!(waits[0], Duration::from_millis(100));
    assert_eq!(waits[1], Duration::from_secs(1));
    assert!(
        waits[2..].iter().all(|w| *w == Duration::from_secs(2)),
        "{waits:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_huge_factor_never_overflows_and_the_cap_holds() {
    for factor in [f64::MAX, 1e300, f64::INFINITY] {
        let s = BackoffStrategy::exponential(
            Duration::from_secs(1),
            factor,
            Duration::from_secs(30),
            Jitter::Full,
        );
        let mut rng = fastrand_rng();
        for retry in [1, 2, 63, 64, 65, 1000, u32::MAX] {
            let w = toolshield_retry::Backoff::wait(&s, retry, Duration::ZERO, &mut rng);
            assert!(w <= Duration::from_secs(30), "retry {retry}: {w:?}");
        }
    }
}

fn fastrand_rng() -> fastrand::Rng {
    fastrand::Rng::with_seed(7)
}

#[tokio::test(start_paused = true)]
async fn equal_jitter_waits_stay_between_half_and_the_nominal_wait() {
    let tool = ScriptedTool::always(ErrorKind::ConnectionFailed);
    let layer = RetryLayer::from_config(&RetryConfig {
        max_attempts: 40,
        backoff: BackoffStrategy::exponential(
            Duration::from_secs(1),
            2.0,
            Duration::from_secs(4),
            Jitter::Equal,
        ),
        ..Default::default()
    })
    .unwrap()
    .without_budget();
    let _ = layer.layer(tool.service()).oneshot(read_request()).await;
    for (i, w) in gaps(&tool.seen()).into_iter().enumerate() {
        let nominal = Duration::from_secs(1 << i.min(2));
        assert!(w >= nominal / 2 && w <= nominal, "retry {}: {w:?}", i + 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_custom_backoff_decides_every_wait() {
    let tool = ScriptedTool::always(ErrorKind::ConnectionFailed);
    let layer = RetryLayer::new(4).without_budget().with_backoff(
        |retry: u32, _prev: Duration, _rng: &mut fastrand::Rng| {
            Duration::from_secs(u64::from(retry) * 7)
        },
    );
    let _ = layer.layer(tool.service()).oneshot(read_request()).await;
    assert_eq!(
        gaps(&tool.seen()),
        [
            Duration::from_secs(7),
            Duration::from_secs(14),
            Duration::from_secs(21)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn client_errors_and_unknown_outcomes_are_never_retried() {
    for kind in [
        ErrorKind::InvalidInput,
        ErrorKind::Unauthorized,
        ErrorKind::NotFound,
        ErrorKind::CircuitOpen,
        ErrorKind::Cancelled,
        ErrorKind::IdempotencyKeyReused,
        ErrorKind::OutcomeUnknown,
        ErrorKind::ExecutionFailed,
    ] {
        let tool = ScriptedTool::always(kind);
        let e = no_wait(5)
            .layer(tool.service())
            .oneshot(read_request())
            .await
            .unwrap_err();
        assert_eq!(tool.calls(), 1, "{kind:?}");
        assert_eq!(e.kind(), kind);
        assert_eq!(e.attempts(), 1);
    }
    for kind in [
        ErrorKind::Timeout,
        ErrorKind::RateLimited,
        ErrorKind::ConnectionFailed,
        ErrorKind::UpstreamUnavailable,
    ] {
        let tool = ScriptedTool::new([
            Err(ToolError::new(kind, "transient").with_retry_after(Duration::ZERO)),
            ok(),
        ]);
        let res = no_wait(5)
            .layer(tool.service())
            .oneshot(read_request())
            .await
            .unwrap();
        assert_eq!(res.provenance.attempts, 2, "{kind:?} is retried");
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyless_mutation_is_attempted_once_whatever_the_failure() {
    for kind in [
        ErrorKind::Timeout,
        ErrorKind::RateLimited,
        ErrorKind::ConnectionFailed,
        ErrorKind::UpstreamUnavailable,
    ] {
        let tool = ScriptedTool::always(kind);
        let req = ToolRequest::new("pay", json!({"amount": 10})).kind(CallKind::Mutating);
        let e = no_wait(5)
            .layer(tool.service())
            .oneshot(req)
            .await
            .unwrap_err();
        assert_eq!(tool.calls(), 1, "{kind:?}");
        assert_eq!(e.kind(), kind);
    }
    // A keyed mutation is not repeated after a timeout (it may have run)...
    let tool = ScriptedTool::always(ErrorKind::Timeout);
    let req = ToolRequest::new("pay", json!({"amount": 10}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-1");
    let _ = no_wait(5).layer(tool.service()).oneshot(req).await;
    assert_eq!(tool.calls(), 1);
    // ...nor after an unknown outcome.
    let tool = ScriptedTool::always(ErrorKind::OutcomeUnknown);
    let req = ToolRequest::new("pay", json!({"amount": 10}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-1");
    let _ = no_wait(5).layer(tool.service()).oneshot(req).await;
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_failures_through_clones_cannot_retry_beyond_the_shared_budget() {
    // ratio 0.1, no floor, 5 tokens at most: 200 failing calls through 200 clones may
    // retry at most 0.1 × 200 = 20 times (the bucket starts empty without a floor).
    let layer = RetryLayer::from_config(&RetryConfig {
        max_attempts: 3,
        backoff: BackoffStrategy::none(),
        budget: BudgetConfig {
            enabled: true,
            ratio: 0.1,
            min_per_sec: 0,
            burst: 5,
        },
        ..Default::default()
    })
    .unwrap();
    let tool = ScriptedTool::always(ErrorKind::UpstreamUnavailable);
    let svc = layer.layer(tool.service());
    let mut calls = Vec::new();
    for _ in 0..200 {
        calls.push(tokio::spawn(svc.clone().oneshot(read_request())));
    }
    for c in calls {
        let _ = c.await.unwrap();
    }
    let retries = tool.calls() - 200;
    assert!(retries <= 20, "{retries} retries for 200 calls at 10 %");
    assert!(retries > 0, "the budget allows some retries");
}

#[tokio::test(start_paused = true)]
async fn one_budget_shared_by_two_layers_is_spent_by_both() {
    let budget = Arc::new(RetryBudget::new(0.0, 2, 2));
    assert_eq!(budget.available(), 2);
    let a = ScriptedTool::always(ErrorKind::ConnectionFailed);
    let b = ScriptedTool::always(ErrorKind::ConnectionFailed);
    let layer_a = no_wait(5).with_budget(Arc::clone(&budget));
    let layer_b = no_wait(5).with_budget(Arc::clone(&budget));
    let _ = layer_a.layer(a.service()).oneshot(read_request()).await;
    let _ = layer_b.layer(b.service()).oneshot(read_request()).await;
    assert_eq!(
        a.calls() + b.calls(),
        4,
        "two first attempts and the two retries the budget held"
    );
}

#[tokio::test(start_paused = true)]
async fn a_token_cancelled_during_the_backoff_ends_the_call_at_once_and_starts_no_attempt() {
    let tool = ScriptedTool::always(ErrorKind::ConnectionFailed);
    let token = CancellationToken::new();
    let layer = RetryLayer::new(5)
        .without_budget()
        .with_backoff(BackoffStrategy::fixed_range(
            Duration::from_secs(30),
            Duration::from_secs(30),
        ));
    let mut svc = layer.layer(tool.service());
    let start = Instant::now();
    let call = tokio::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(read_request().cancel_token(token.clone())),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    token.cancel();
    let e = call.await.unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_token_cancelled_before_a_retriable_failure_ends_cancelled_without_a_retry() {
    let token = CancellationToken::new();
    token.cancel();
    let tool = ScriptedTool::always(ErrorKind::ConnectionFailed);
    let e = no_wait(5)
        .layer(tool.service())
        .oneshot(read_request().cancel_token(token))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_response_that_is_ready_wins_over_a_cancel_that_came_with_it() {
    // The tool cancels the caller's token and answers in the same poll.
    let token = CancellationToken::new();
    let inner_token = token.clone();
    let tool = tower::service_fn(move |_req: ToolRequest| {
        let token = inner_token.clone();
        async move {
            token.cancel();
            Ok::<_, ToolError>(toolshield_core::ToolResponse::new(json!("answer")))
        }
    });
    let res = no_wait(3)
        .layer(tool)
        .oneshot(read_request().cancel_token(token))
        .await
        .unwrap();
    assert_eq!(res.output, json!("answer"));
    assert_eq!(res.provenance.attempts, 1);
}
