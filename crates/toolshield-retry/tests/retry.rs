//! Behaviour of the retry layer with tokio's paused clock.

mod common;

use std::time::Duration;

use common::{err, ok, read_request};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_core::{
    CallKind, ErrorKind, Failure, Outcome, ToolError, ToolRequest, ToolResponse,
};
use toolshield_retry::{BackoffStrategy, Jitter, RetryConfig, RetryLayer};
use toolshield_test::{gaps, ScriptedTool};
use tower::{Layer, ServiceExt};

fn no_wait() -> RetryLayer {
    RetryLayer::default().with_backoff(BackoffStrategy::none())
}

#[tokio::test(start_paused = true)]
async fn retriable_failure_is_retried_up_to_the_limit_and_the_last_error_returned() {
    let tool = ScriptedTool::new([
        err(ErrorKind::Timeout),
        err(ErrorKind::ConnectionFailed),
        err(ErrorKind::UpstreamUnavailable),
        ok(),
    ]);
    let layer = no_wait();
    let e = layer
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap_err();
    assert_eq!(tool.calls(), 3, "3 attempts in total by default");
    assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable, "the last error");
    assert_eq!(e.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_success_after_failures_records_the_attempts_in_provenance() {
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    let res = no_wait()
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.output, json!({"temp": 21}));
    assert_eq!(res.provenance.attempts, 2);

    let first = ScriptedTool::new([ok()]);
    let res = no_wait()
        .layer(first.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn non_retriable_errors_are_returned_after_one_attempt() {
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
        let layer = no_wait();
        let e = layer
            .layer(tool.service())
            .oneshot(read_request())
            .await
            .unwrap_err();
        assert_eq!(tool.calls(), 1, "{kind} must not be retried");
        assert_eq!(e.kind(), kind);
        assert_eq!(e.attempts(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn waits_follow_the_configured_backoff() {
    let tool = ScriptedTool::always(ErrorKind::Timeout);
    let layer = RetryLayer::from_config(&RetryConfig {
        max_attempts: 5,
        backoff: BackoffStrategy::exponential(
            Duration::from_millis(100),
            2.0,
            Duration::from_millis(300),
            Jitter::None,
        ),
        ..Default::default()
    })
    .unwrap();
    let start = Instant::now();
    let _ = layer.layer(tool.service()).oneshot(read_request()).await;
    assert_eq!(
        gaps(&tool.seen()),
        [100, 200, 300, 300].map(Duration::from_millis),
        "100 ms, x2, capped at 300 ms"
    );
    assert_eq!(start.elapsed(), Duration::from_millis(900));
}

#[tokio::test(start_paused = true)]
async fn layer_waits_stay_inside_the_jitter_bounds() {
    // Default: exponential 500 ms x2 capped at 5 s, full jitter, checked over many calls.
    let layer = RetryLayer::from_config(&RetryConfig {
        max_attempts: 6,
        ..Default::default()
    })
    .unwrap()
    .without_budget();
    let nominal = [500, 1000, 2000, 4000, 5000].map(Duration::from_millis);
    let mut all_equal_to_nominal = true;
    for _ in 0..50 {
        let tool = ScriptedTool::always(ErrorKind::ConnectionFailed);
        let _ = layer.layer(tool.service()).oneshot(read_request()).await;
        let g = gaps(&tool.seen());
        assert_eq!(g.len(), 5);
        for (wait, max) in g.iter().zip(nominal) {
            assert!(*wait <= max, "{wait:?} > {max:?}");
            all_equal_to_nominal &= *wait == max;
        }
    }
    assert!(!all_equal_to_nominal, "full jitter must vary the waits");
}

#[tokio::test(start_paused = true)]
async fn rate_limited_with_retry_after_waits_exactly_that_long() {
    let tool = ScriptedTool::new([
        Err(ToolError::rate_limited("429", Some(Duration::from_secs(7)))),
        ok(),
    ]);
    let res = RetryLayer::default()
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 2);
    assert_eq!(gaps(&tool.seen()), [Duration::from_secs(7)]);
}

#[tokio::test(start_paused = true)]
async fn rate_limited_without_retry_after_waits_the_rate_limit_backoff() {
    let tool = ScriptedTool::new([Err(ToolError::rate_limited("429", None)), ok()]);
    RetryLayer::default()
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(gaps(&tool.seen()), [Duration::from_secs(30)]);

    // Configurable.
    let tool = ScriptedTool::new([Err(ToolError::rate_limited("429", None)), ok()]);
    RetryLayer::from_config(&RetryConfig {
        rate_limit_backoff: Duration::from_secs(12),
        ..Default::default()
    })
    .unwrap()
    .layer(tool.service())
    .oneshot(read_request())
    .await
    .unwrap();
    assert_eq!(gaps(&tool.seen()), [Duration::from_secs(12)]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_would_cross_the_deadline_is_not_started() {
    let tool = ScriptedTool::new([
        Err(ToolError::rate_limited("429", Some(Duration::from_secs(7)))),
        ok(),
    ]);
    let layer = RetryLayer::default();
    let start = Instant::now();
    let req = read_request().deadline(start + Duration::from_secs(5));
    let e = layer.layer(tool.service()).oneshot(req).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RateLimited, "the last error, at once");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(e.attempts(), 1);
    assert_eq!(tool.calls(), 1);
    assert_eq!(start.elapsed(), Duration::ZERO, "no wait at all");

    // A wait that ends before the deadline is taken.
    let tool = ScriptedTool::new([
        Err(ToolError::rate_limited("429", Some(Duration::from_secs(3)))),
        ok(),
    ]);
    let req = read_request().deadline(Instant::now() + Duration::from_secs(5));
    let res = layer.layer(tool.service()).oneshot(req).await.unwrap();
    assert_eq!(res.provenance.attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_token_cancelled_during_the_wait_ends_the_call_with_cancelled() {
    let tool = ScriptedTool::always(ErrorKind::UpstreamUnavailable);
    let token = CancellationToken::new();
    let layer = RetryLayer::from_config(&RetryConfig {
        backoff: BackoffStrategy::fixed_range(Duration::from_secs(10), Duration::from_secs(10)),
        ..Default::default()
    })
    .unwrap();
    let req = read_request().cancel_token(token.clone());
    let start = Instant::now();
    let call = tokio::spawn(layer.layer(tool.service()).oneshot(req));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(tool.calls(), 1, "first attempt done, now backing off");
    token.cancel();
    let e = call.await.unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    assert_eq!(e.attempts(), 1);
    assert_eq!(start.elapsed(), Duration::from_secs(2), "ended at once");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(tool.calls(), 1, "no further attempt");
}

#[tokio::test(start_paused = true)]
async fn a_mutating_call_is_retried_only_with_an_idempotency_key() {
    let without_key = ToolRequest::new("pay", json!({"amount": 10})).kind(CallKind::Mutating);
    let tool = ScriptedTool::always(ErrorKind::Timeout);
    let e = no_wait()
        .layer(tool.service())
        .oneshot(without_key)
        .await
        .unwrap_err();
    assert_eq!(tool.calls(), 1, "attempted once");
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(e.attempts(), 1);

    let with_key = ToolRequest::new("pay", json!({"amount": 10}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-42");
    // Refused before it was sent: nothing ran, so it may be sent again.
    let tool = ScriptedTool::new([err(ErrorKind::ConnectionFailed), ok()]);
    let res = no_wait()
        .layer(tool.service())
        .oneshot(with_key)
        .await
        .unwrap();
    assert_eq!(tool.calls(), 2, "retried");
    assert_eq!(res.provenance.attempts, 2);

    // Idempotent calls need no key.
    let idempotent = ToolRequest::new("put", json!({})).kind(CallKind::Idempotent);
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    no_wait()
        .layer(tool.service())
        .oneshot(idempotent)
        .await
        .unwrap();
    assert_eq!(tool.calls(), 2);
}

/// A blank key is no key (docs/idempotency.md: "A blank key (`""`, `"  "`) is no key"; the
/// `http::Request` impl reads a blank header as none): a mutation carrying one is attempted
/// once, like one without a key.
#[tokio::test(start_paused = true)]
async fn a_mutating_call_with_a_blank_idempotency_key_is_attempted_once() {
    for key in ["", " ", "\t \n"] {
        let req = ToolRequest::new("pay", json!({"amount": 10}))
            .kind(CallKind::Mutating)
            .idempotency_key(key);
        // A failure that a keyed mutation would be retried after.
        let tool = ScriptedTool::new([err(ErrorKind::ConnectionFailed), ok()]);
        let e = no_wait()
            .layer(tool.service())
            .oneshot(req)
            .await
            .unwrap_err();
        assert_eq!(tool.calls(), 1, "key {key:?} is no key: attempted once");
        assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
        assert_eq!(e.attempts(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_mutation_that_may_have_taken_effect_is_never_repeated_even_with_a_key() {
    let keyed = || {
        ToolRequest::new("pay", json!({"amount": 10}))
            .kind(CallKind::Mutating)
            .idempotency_key("order-7")
    };
    // Whatever the classifier says: here every failure is retriable.
    let retry_all = |r: &Result<ToolResponse, ToolError>| match r {
        Ok(_) => Outcome::Success,
        Err(e) => Outcome::Failure(Failure {
            retriable: true,
            ..Failure::of_kind(e.kind())
        }),
    };
    for kind in [
        ErrorKind::Timeout,
        ErrorKind::OutcomeUnknown,
        ErrorKind::Internal,
    ] {
        let tool = ScriptedTool::new([err(kind), ok()]);
        let e = no_wait()
            .with_classifier(retry_all)
            .layer(tool.service())
            .oneshot(keyed())
            .await
            .unwrap_err();
        assert_eq!(tool.calls(), 1, "{kind:?}: not sent again");
        assert_eq!(e.kind(), kind, "the attempt's error, as it was");
        assert_eq!(e.attempts(), 1);
    }
    // The same failure of an idempotent call is retried.
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    let idempotent = ToolRequest::new("put", json!({})).kind(CallKind::Idempotent);
    no_wait()
        .layer(tool.service())
        .oneshot(idempotent)
        .await
        .unwrap();
    assert_eq!(tool.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn every_attempt_gets_a_new_execution_id_and_attempt_token() {
    let tool = ScriptedTool::always(ErrorKind::Timeout);
    let req = read_request();
    let call_token = req.call_token().clone();
    let _ = no_wait().layer(tool.service()).oneshot(req).await;
    let seen = tool.seen();
    assert_eq!(
        seen.iter().map(|s| s.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let mut ids: Vec<_> = seen.iter().map(|s| s.execution_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "three distinct execution ids");
    for s in &seen[1..] {
        assert!(
            !s.attempt_token.is_cancelled(),
            "completed attempts are not cancelled"
        );
    }
    // A fresh attempt token is a child of the call token.
    call_token.cancel();
    assert!(seen[2].attempt_token.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_mid_attempt_cancels_the_attempt_token_it_created() {
    // The second attempt never finishes; the caller gives up on it.
    let (mock, mut handle) = tower_test::mock::pair::<ToolRequest, ToolResponse>();
    let svc = no_wait().layer(mock.map_err(to_tool_error));
    let req = read_request();
    let call_token = req.call_token().clone();
    let call = tokio::spawn(svc.oneshot(req));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_error(ToolError::timeout("attempt timed out"));
    let (second, _reply) = handle.next_request().await.unwrap();
    assert_eq!(second.attempt(), 2);
    let attempt_token = second.attempt_token().clone();
    assert!(!attempt_token.is_cancelled());
    call.abort();
    let _ = call.await;
    assert!(
        attempt_token.is_cancelled(),
        "the dropped attempt's token is cancelled"
    );
    assert!(
        !call_token.is_cancelled(),
        "the caller's token is left alone"
    );
}

fn to_tool_error(e: Box<dyn std::error::Error + Send + Sync>) -> ToolError {
    match e.downcast::<ToolError>() {
        Ok(e) => *e,
        Err(e) => ToolError::internal(e.to_string()),
    }
}

#[tokio::test(start_paused = true)]
async fn each_attempt_polls_the_inner_service_ready_again() {
    let (mock, mut handle) = tower_test::mock::pair::<ToolRequest, ToolResponse>();
    handle.allow(0);
    let mut svc = no_wait().layer(mock.map_err(to_tool_error));

    // Not ready at first: the layer passes readiness through.
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    assert!(tower::Service::poll_ready(&mut svc, &mut cx).is_pending());
    handle.allow(1);
    let call = tokio::spawn(svc.oneshot(read_request()));
    let (first, reply) = handle.next_request().await.unwrap();
    assert_eq!(first.attempt(), 1);
    reply.send_error(ToolError::new(ErrorKind::ConnectionFailed, "reset"));

    // The retry waits for readiness: no second request while the service is not ready.
    let waited = tokio::time::timeout(Duration::from_secs(60), handle.next_request()).await;
    assert!(
        waited.is_err(),
        "a retry was sent to a service that was not ready"
    );
    assert!(!call.is_finished());

    handle.allow(1);
    let (second, reply) = handle.next_request().await.unwrap();
    assert_eq!(second.attempt(), 2);
    reply.send_response(ToolResponse::new(json!({"ok": true})));
    let res = call.await.unwrap().unwrap();
    assert_eq!(res.provenance.attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_readiness_error_during_a_retry_ends_the_call() {
    let (mock, mut handle) = tower_test::mock::pair::<ToolRequest, ToolResponse>();
    let svc = no_wait().layer(mock.map_err(to_tool_error));
    let call = tokio::spawn(svc.oneshot(read_request()));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_error(ToolError::timeout("slow"));
    handle.send_error(ToolError::new(ErrorKind::ConnectionFailed, "pool closed"));
    let e = call.await.unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
    assert_eq!(e.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_custom_classifier_can_retry_an_in_band_failure() {
    // The tool answers "isError": true once; the user's classifier deems it retriable.
    let tool = ScriptedTool::new([
        Ok(ToolResponse::new(
            json!({"isError": true, "content": "schema mismatch"}),
        )),
        ok(),
    ]);
    let classifier = |r: &Result<ToolResponse, ToolError>| match r {
        Ok(res) if res.is_error() => Outcome::Failure(Failure {
            retriable: true,
            ..Failure::of_kind(ErrorKind::ExecutionFailed)
        }),
        Ok(_) => Outcome::Success,
        Err(e) => toolshield_core::DefaultClassifier::classify_error(e),
    };
    let res = no_wait()
        .with_classifier(classifier)
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert_eq!(res.output, json!({"temp": 21}));
    assert_eq!(res.provenance.attempts, 2);

    // With the default classifier an in-band EXECUTION_FAILED is final, returned as is.
    let tool = ScriptedTool::new([Ok(ToolResponse::new(json!({"isError": true}))), ok()]);
    let res = no_wait()
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap();
    assert!(res.is_error());
    assert_eq!(res.provenance.attempts, 1);
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn one_attempt_configured_means_no_retry() {
    let tool = ScriptedTool::always(ErrorKind::Timeout);
    let e = RetryLayer::from_config(&RetryConfig {
        max_attempts: 1,
        ..Default::default()
    })
    .unwrap()
    .layer(tool.service())
    .oneshot(read_request())
    .await
    .unwrap_err();
    assert_eq!(tool.calls(), 1);
    assert_eq!(e.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_token_cancelled_while_waiting_for_readiness_ends_the_call_without_another_attempt() {
    let (mock, mut handle) = tower_test::mock::pair::<ToolRequest, ToolResponse>();
    handle.allow(1);
    let svc = no_wait().layer(mock.map_err(to_tool_error));
    let token = CancellationToken::new();
    let req = read_request().cancel_token(token.clone());
    let call = tokio::spawn(svc.oneshot(req));
    let (_, reply) = handle.next_request().await.unwrap();
    // The inner service is not ready again: the retry waits for it.
    reply.send_error(ToolError::new(ErrorKind::ConnectionFailed, "refused"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!call.is_finished(), "waiting for readiness");
    token.cancel();
    let e = call.await.unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    assert_eq!(e.attempts(), 1);
    handle.allow(1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let next = tokio::time::timeout(Duration::ZERO, handle.next_request()).await;
    assert!(
        matches!(next, Err(_) | Ok(None)),
        "no second attempt (the call dropped its services)"
    );
}
