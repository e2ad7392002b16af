//! Escalation rounds: predicates asked again, mutations never re-sent to a tier that may
//! have run them, a panicking hook contained.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_fallback::{Escalation, FallbackLayer};
use tower::{service_fn, Layer, ServiceExt};

type Svc = tower::util::BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

/// A service that counts its calls and fails with `kind`.
fn failing(calls: &Arc<AtomicU32>, kind: ErrorKind) -> Svc {
    let calls = calls.clone();
    Svc::new(service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Err(ToolError::new(kind, "scripted failure")) }
    }))
}

fn counter() -> Arc<AtomicU32> {
    Arc::new(AtomicU32::new(0))
}

fn mutation() -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": 10}))
        .kind(CallKind::Mutating)
        .idempotency_key("k-1")
}

#[tokio::test]
async fn a_retried_escalation_never_sends_a_mutation_back_to_a_tier_that_may_have_run_it() {
    for kind in [ErrorKind::Timeout, ErrorKind::OutcomeUnknown] {
        // With the default predicates and with a tier that accepts any error: the rule
        // holds whatever the predicate says.
        for accept_all in [false, true] {
            let (p, m) = (counter(), counter());
            let hook_calls = counter();
            let h = hook_calls.clone();
            let layer = if accept_all {
                FallbackLayer::new().tier_when("mirror", failing(&m, kind), |_, _| true)
            } else {
                FallbackLayer::new().tier("mirror", failing(&m, kind))
            };
            let svc = layer
                .escalate(move |_failure| {
                    h.fetch_add(1, Ordering::SeqCst);
                    async { Escalation::Retry }
                })
                .max_escalations(3)
                .layer(failing(&p, ErrorKind::CircuitOpen));
            let err = svc.oneshot(mutation()).await.unwrap_err();
            assert_eq!(err.kind(), kind, "the mirror's error stands");
            assert_eq!(m.load(Ordering::SeqCst), 1, "{kind:?}: the mirror ran once");
            assert_eq!(p.load(Ordering::SeqCst), 1);
            assert_eq!(hook_calls.load(Ordering::SeqCst), 1);
        }
    }
}

#[tokio::test]
async fn a_modified_request_cannot_make_a_mutation_safe_to_resend() {
    let (p, m) = (counter(), counter());
    let svc = FallbackLayer::new()
        .tier_when("mirror", failing(&m, ErrorKind::Timeout), |_, _| true)
        .escalate(
            |failure| async move { Escalation::Modify(failure.request.kind(CallKind::ReadOnly)) },
        )
        .layer(failing(&p, ErrorKind::CircuitOpen));
    let err = svc.oneshot(mutation()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(m.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_mutation_goes_back_to_a_tier_whose_breaker_was_open() {
    // CIRCUIT_OPEN proves the tier never ran: a retried round may send the call again.
    let (p, m) = (counter(), counter());
    let svc = FallbackLayer::new()
        .tier("mirror", failing(&m, ErrorKind::CircuitOpen))
        .escalate(|_failure| async { Escalation::Retry })
        .layer(failing(&p, ErrorKind::CircuitOpen));
    let err = svc.oneshot(mutation()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(m.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_retried_escalation_asks_the_predicates_again() {
    // The mirror only takes CIRCUIT_OPEN; after it failed with TIMEOUT, a retried round
    // starts as a hand-over from that TIMEOUT, which the mirror does not take.
    let (p, m, s) = (counter(), counter(), counter());
    let svc = FallbackLayer::new()
        .tier_when("mirror", failing(&m, ErrorKind::Timeout), |_, e| {
            e.kind() == ErrorKind::CircuitOpen
        })
        .tier("snapshot", failing(&s, ErrorKind::UpstreamUnavailable))
        .escalate(|_failure| async { Escalation::Retry })
        .layer(failing(&p, ErrorKind::CircuitOpen));
    let read = ToolRequest::new("search", json!({"q": "x"})).kind(CallKind::ReadOnly);
    let err = svc.oneshot(read).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(
        m.load(Ordering::SeqCst),
        1,
        "the mirror's predicate refused"
    );
    assert_eq!(s.load(Ordering::SeqCst), 2, "the snapshot takes it again");
}

#[tokio::test]
async fn a_panicking_escalation_hook_ends_the_call_with_internal() {
    // The hook panics when called.
    let (p, m) = (counter(), counter());
    let svc = FallbackLayer::new()
        .tier("mirror", failing(&m, ErrorKind::Timeout))
        .escalate(
            |_failure| -> std::future::Ready<Escalation<ToolRequest, ToolResponse>> {
                panic!("secret sk_live_123 in the hook")
            },
        )
        .layer(failing(&p, ErrorKind::CircuitOpen));
    let read = ToolRequest::new("search", json!({})).kind(CallKind::ReadOnly);
    let err = svc.oneshot(read).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(!err.to_string().contains("sk_live"), "{err}");

    // The hook's future panics when polled.
    let (p, m) = (counter(), counter());
    let svc = FallbackLayer::new()
        .tier("mirror", failing(&m, ErrorKind::Timeout))
        .escalate(|_failure| async {
            if true {
                panic!("secret sk_live_456 in the hook's future");
            }
            Escalation::Abort
        })
        .layer(failing(&p, ErrorKind::CircuitOpen));
    let read = ToolRequest::new("search", json!({})).kind(CallKind::ReadOnly);
    let err = svc.oneshot(read).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(!err.to_string().contains("sk_live"), "{err}");
    assert!(!err.for_model("search").contains("sk_live"));
}
