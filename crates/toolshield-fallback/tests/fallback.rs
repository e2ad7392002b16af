//! Behaviour of fallback chains.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_fallback::{Escalation, FallbackLayer};
use tower::{service_fn, Layer, ServiceExt};

type Svc = tower::util::BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

/// A service that counts its calls and answers `result`.
fn tool(calls: &Arc<AtomicU32>, result: Result<&'static str, ErrorKind>) -> Svc {
    let calls = calls.clone();
    Svc::new(service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            match result {
                Ok(v) => Ok(ToolResponse::new(json!(v))),
                Err(kind) => Err(ToolError::new(kind, format!("{} failed", kind.code()))),
            }
        }
    }))
}

fn counters<const N: usize>() -> [Arc<AtomicU32>; N] {
    std::array::from_fn(|_| Arc::new(AtomicU32::new(0)))
}

#[tokio::test]
async fn primary_success_never_touches_the_tiers() {
    let [p, m] = counters();
    let svc = FallbackLayer::new()
        .tier("mirror", tool(&m, Ok("mirror")))
        .layer(tool(&p, Ok("primary")));
    let res = svc
        .oneshot(ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly))
        .await
        .unwrap();
    assert_eq!(res.output, json!("primary"));
    assert_eq!(res.provenance.tier, None);
    assert_eq!((p.load(Ordering::SeqCst), m.load(Ordering::SeqCst)), (1, 0));
}

#[tokio::test]
async fn circuit_open_and_exhausted_retriable_errors_hand_over_in_order() {
    let [p, m, s] = counters();
    let svc = FallbackLayer::new()
        .tier("mirror", tool(&m, Err(ErrorKind::Timeout)))
        .tier("snapshot", tool(&s, Ok("snapshot")))
        .layer(tool(&p, Err(ErrorKind::CircuitOpen)));
    let stats_svc = svc.clone();
    let res = svc
        .oneshot(ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly))
        .await
        .unwrap();
    assert_eq!(res.output, json!("snapshot"));
    assert_eq!(res.provenance.tier.as_deref(), Some("snapshot"));
    assert_eq!([&p, &m, &s].map(|c| c.load(Ordering::SeqCst)), [1, 1, 1]);
    let hand_overs: Vec<_> = stats_svc
        .stats()
        .hand_overs()
        .into_iter()
        .map(|(n, c)| (n.to_string(), c))
        .collect();
    assert_eq!(
        hand_overs,
        [("mirror".to_owned(), 1), ("snapshot".to_owned(), 1)]
    );
}

#[tokio::test]
async fn client_errors_and_cancellation_stay_with_the_caller() {
    for kind in [
        ErrorKind::InvalidInput,
        ErrorKind::NotFound,
        ErrorKind::Cancelled,
        ErrorKind::OutcomeUnknown,
    ] {
        let [p, m] = counters();
        let svc = FallbackLayer::new()
            .tier("mirror", tool(&m, Ok("mirror")))
            .layer(tool(&p, Err(kind)));
        let err = svc
            .oneshot(ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind);
        assert_eq!(
            err.message(),
            format!("{} failed", kind.code()),
            "returned unchanged"
        );
        assert_eq!(m.load(Ordering::SeqCst), 0, "{kind} must not hand over");
    }
}

#[tokio::test]
async fn a_mutation_hands_over_only_when_the_primary_never_ran() {
    let [p, m] = counters();
    let svc = FallbackLayer::new()
        .tier("mirror", tool(&m, Ok("mirror")))
        .layer(tool(&p, Err(ErrorKind::Timeout)));
    let err = svc
        .clone()
        .oneshot(ToolRequest::new("pay", json!({})).kind(CallKind::Mutating))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(
        m.load(Ordering::SeqCst),
        0,
        "a timed-out mutation may have happened"
    );

    let [p2, m2] = counters();
    let svc = FallbackLayer::new()
        .tier("mirror", tool(&m2, Ok("mirror")))
        .layer(tool(&p2, Err(ErrorKind::CircuitOpen)));
    let res = svc
        .oneshot(ToolRequest::new("pay", json!({})).kind(CallKind::Mutating))
        .await
        .unwrap();
    assert_eq!(res.provenance.tier.as_deref(), Some("mirror"));
}

#[tokio::test]
async fn each_tier_has_its_own_predicate() {
    let [p, m, s] = counters();
    let svc = FallbackLayer::new()
        // the mirror only takes rate limits
        .tier_when(
            "mirror",
            tool(&m, Ok("mirror")),
            |_req: &ToolRequest, e: &ToolError| e.kind() == ErrorKind::RateLimited,
        )
        .tier("snapshot", tool(&s, Ok("snapshot")))
        .layer(tool(&p, Err(ErrorKind::CircuitOpen)));
    let res = svc
        .oneshot(ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly))
        .await
        .unwrap();
    assert_eq!(res.provenance.tier.as_deref(), Some("snapshot"));
    assert_eq!(m.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn when_every_tier_fails_the_error_lists_each_one() {
    let [p, m] = counters();
    let limited = Svc::new(service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::rate_limited(
            "mirror is rate limited",
            Some(Duration::from_secs(7)),
        ))
    }));
    let svc = FallbackLayer::new()
        .tier("mirror", limited)
        .tier("snapshot", tool(&m, Err(ErrorKind::UpstreamUnavailable)))
        .layer(tool(&p, Err(ErrorKind::CircuitOpen)));
    let stats = svc.clone();
    let err = svc
        .oneshot(ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::UpstreamUnavailable,
        "the last tier's kind"
    );
    let msg = err.message();
    for part in [
        "primary: CIRCUIT_OPEN",
        "mirror: RATE_LIMITED",
        "snapshot: UPSTREAM_UNAVAILABLE",
    ] {
        assert!(msg.contains(part), "{msg}");
    }
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(stats.stats().exhausted(), 1);
}

#[tokio::test]
async fn escalation_can_skip_abort_or_retry() {
    // skip: the application supplies a substitute
    let [p, m] = counters();
    let svc = FallbackLayer::new()
        .tier("mirror", tool(&m, Err(ErrorKind::Timeout)))
        .escalate(|failure| async move {
            assert_eq!(failure.errors.len(), 2);
            Escalation::Skip(ToolResponse::new(json!("ask the user later")))
        })
        .layer(tool(&p, Err(ErrorKind::CircuitOpen)));
    let res = svc
        .oneshot(ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly))
        .await
        .unwrap();
    assert_eq!(res.output, json!("ask the user later"));
    assert_eq!(res.provenance.tier.as_deref(), Some("escalation"));

    // abort: the combined error
    let [p, m] = counters();
    let svc = FallbackLayer::new()
        .tier("mirror", tool(&m, Err(ErrorKind::Timeout)))
        .escalate(|_failure| async { Escalation::Abort })
        .layer(tool(&p, Err(ErrorKind::CircuitOpen)));
    let err = svc
        .oneshot(ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly))
        .await
        .unwrap_err();
    assert!(err.message().contains("every tier failed"));

    // retry: the tiers run again, bounded by max_escalations
    let [p, m] = counters();
    let hook_calls = Arc::new(AtomicU32::new(0));
    let h = hook_calls.clone();
    let svc = FallbackLayer::new()
        .tier("mirror", tool(&m, Err(ErrorKind::Timeout)))
        .escalate(move |_failure| {
            h.fetch_add(1, Ordering::SeqCst);
            async { Escalation::Retry }
        })
        .max_escalations(2)
        .layer(tool(&p, Err(ErrorKind::CircuitOpen)));
    let err = svc
        .oneshot(ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(hook_calls.load(Ordering::SeqCst), 2);
    assert_eq!(p.load(Ordering::SeqCst), 1, "the primary is not re-run");
    assert_eq!(
        m.load(Ordering::SeqCst),
        3,
        "the mirror ran once, then once per escalation"
    );
}
