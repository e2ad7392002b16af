//! A mutation with no idempotency key (none given, key derivation off): nothing can be
//! recorded, but what the caller is told follows the same rule as with a key. A mutation
//! that timed out or failed inside the tool layer after it was sent may have taken
//! effect: it ends `OUTCOME_UNKNOWN`, never `TIMEOUT`, which an agent would read as "not
//! done, try again".

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer};
use toolshield_test::counting_tool;
use tower::{Layer, ServiceExt};

fn layer() -> IdempotencyLayer {
    IdempotencyLayer::new(IdempotencyConfig {
        derive_keys: false,
        ..Default::default()
    })
    .expect("config")
}

fn keyless(kind: CallKind) -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": 42})).kind(kind)
}

async fn ends_with(kind: CallKind, error: ToolError) -> (ToolError, usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    let answer = move |_| Err(error.clone());
    let tool = counting_tool(&runs, Duration::ZERO, answer);
    let err = layer()
        .layer(tool)
        .oneshot(keyless(kind))
        .await
        .expect_err("the tool failed");
    (err, runs.load(Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn a_keyless_mutation_that_timed_out_after_it_was_sent_ends_outcome_unknown() {
    let layer = layer();
    let handle = layer.handle();
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = counting_tool(&runs, Duration::ZERO, |_| {
        Err(ToolError::timeout("attempt exceeded 1s"))
    });
    let err = layer
        .layer(tool)
        .oneshot(keyless(CallKind::Mutating))
        .await
        .expect_err("timed out");
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert!(
        err.message().contains("timed out after it was sent"),
        "{err}"
    );
    assert!(err.message().contains("no idempotency key"), "{err}");
    assert!(!err.kind().is_retriable());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(handle.counts().outcome_unknown, 1);
}

#[tokio::test(start_paused = true)]
async fn a_keyless_mutation_that_failed_inside_the_tool_layer_ends_outcome_unknown() {
    let (err, runs) = ends_with(CallKind::Mutating, ToolError::internal("tool panicked")).await;
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(runs, 1);
}

#[tokio::test(start_paused = true)]
async fn a_keyless_mutations_other_errors_reach_the_caller_unchanged() {
    for error in [
        ToolError::new(ErrorKind::UpstreamUnavailable, "503"),
        ToolError::invalid_input("amount must be positive"),
        ToolError::cancelled("caller left"),
        ToolError::new(ErrorKind::OutcomeUnknown, "the server lost the task"),
    ] {
        let (err, runs) = ends_with(CallKind::Mutating, error.clone()).await;
        assert_eq!(err.kind(), error.kind());
        assert_eq!(err.message(), error.message());
        assert_eq!(runs, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyless_call_that_is_not_a_mutation_keeps_its_timeout() {
    for kind in [CallKind::Idempotent, CallKind::ReadOnly] {
        let (err, _) = ends_with(kind, ToolError::timeout("attempt exceeded 1s")).await;
        assert_eq!(err.kind(), ErrorKind::Timeout, "{kind:?}");
    }
}
