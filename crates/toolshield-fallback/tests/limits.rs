//! A tier is a call like any other: it respects the caller's cancellation, the request's
//! deadline, and a panic of the tier does not unwind into the caller's task.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{
    CallKind, CancellationToken, ErrorKind, ToolError, ToolRequest, ToolResponse,
};
use toolshield_fallback::{Escalation, FallbackLayer};
use tower::{service_fn, Layer, ServiceExt};

type Svc = tower::util::BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

/// Counts its calls; fails with `kind` after `delay`.
fn failing(calls: &Arc<AtomicU32>, kind: ErrorKind, delay: Duration) -> Svc {
    let calls = calls.clone();
    Svc::new(service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            Err(ToolError::new(kind, format!("{} failed", kind.code())))
        }
    }))
}

/// Counts its calls and answers after `delay`, keeping the attempt token it was given.
fn answering(
    calls: &Arc<AtomicU32>,
    delay: Duration,
    seen: &Arc<Mutex<Option<CancellationToken>>>,
) -> Svc {
    let calls = calls.clone();
    let seen = seen.clone();
    Svc::new(service_fn(move |req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        *seen.lock().unwrap() = Some(req.attempt_token().clone());
        async move {
            tokio::time::sleep(delay).await;
            Ok(ToolResponse::new(json!("tier")))
        }
    }))
}

fn counters<const N: usize>() -> [Arc<AtomicU32>; N] {
    std::array::from_fn(|_| Arc::new(AtomicU32::new(0)))
}

fn read() -> ToolRequest {
    ToolRequest::new("t", json!(null)).kind(CallKind::ReadOnly)
}

#[tokio::test(start_paused = true)]
async fn a_tier_never_starts_after_the_caller_cancelled() {
    let [p, m] = counters();
    let seen = Arc::new(Mutex::new(None));
    let token = CancellationToken::new();
    let svc = FallbackLayer::new()
        .tier("mirror", answering(&m, Duration::ZERO, &seen))
        .layer(failing(&p, ErrorKind::CircuitOpen, Duration::from_secs(1)));
    let call = tokio::spawn(svc.oneshot(read().cancel_token(token.clone())));
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert_eq!(
        m.load(Ordering::SeqCst),
        0,
        "the tier was called after the cancel"
    );
}

#[tokio::test(start_paused = true)]
async fn the_escalation_hook_is_not_asked_after_the_caller_cancelled() {
    let [p, m] = counters();
    let hooked = Arc::new(AtomicU32::new(0));
    let token = CancellationToken::new();
    let h = hooked.clone();
    let svc = FallbackLayer::new()
        .tier(
            "mirror",
            failing(&m, ErrorKind::Timeout, Duration::from_secs(1)),
        )
        .escalate(move |_| {
            h.fetch_add(1, Ordering::SeqCst);
            async { Escalation::Retry }
        })
        .layer(failing(&p, ErrorKind::CircuitOpen, Duration::ZERO));
    let t = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        t.cancel();
    });
    let err = svc.oneshot(read().cancel_token(token)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert_eq!(hooked.load(Ordering::SeqCst), 0);
    assert_eq!(m.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_tier_never_starts_once_the_deadline_has_passed() {
    let [p, m] = counters();
    let seen = Arc::new(Mutex::new(None));
    let svc = FallbackLayer::new()
        .tier("mirror", answering(&m, Duration::ZERO, &seen))
        .layer(failing(&p, ErrorKind::Timeout, Duration::from_secs(2)));
    let deadline = Instant::now() + Duration::from_secs(2);
    let err = svc.oneshot(read().deadline(deadline)).await.unwrap_err();
    // The primary's error stands, as retry returns the last error past the deadline.
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(err.message(), "TIMEOUT failed");
    assert_eq!(
        m.load(Ordering::SeqCst),
        0,
        "the tier was called past the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_tier_is_cut_at_the_requests_deadline_and_its_token_cancelled() {
    let [p, m] = counters();
    let seen = Arc::new(Mutex::new(None));
    let svc = FallbackLayer::new()
        .tier("mirror", answering(&m, Duration::from_secs(3600), &seen))
        .layer(failing(&p, ErrorKind::CircuitOpen, Duration::ZERO));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(5);
    let err = svc.oneshot(read().deadline(deadline)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.message().contains("mirror"), "{err}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(m.load(Ordering::SeqCst), 1);
    let token = seen.lock().unwrap().clone().expect("the tier was called");
    assert!(token.is_cancelled(), "the cut tier's attempt token fires");
}

#[tokio::test(start_paused = true)]
async fn a_tier_that_answers_before_the_deadline_is_not_cut() {
    let [p, m] = counters();
    let seen = Arc::new(Mutex::new(None));
    let svc = FallbackLayer::new()
        .tier("mirror", answering(&m, Duration::from_secs(4), &seen))
        .layer(failing(&p, ErrorKind::CircuitOpen, Duration::ZERO));
    let deadline = Instant::now() + Duration::from_secs(5);
    let res = svc.oneshot(read().deadline(deadline)).await.unwrap();
    assert_eq!(res.provenance.tier.as_deref(), Some("mirror"));
    let token = seen.lock().unwrap().clone().expect("the tier was called");
    assert!(
        !token.is_cancelled(),
        "a tier that answered keeps its token"
    );
}

#[tokio::test]
async fn a_panicking_tier_ends_the_call_with_internal_not_a_panic() {
    let [p] = counters();
    let in_future = Svc::new(service_fn(|_req: ToolRequest| async {
        if true {
            panic!("secret argument in the panic text");
        }
        Ok::<_, ToolError>(ToolResponse::new(json!("never")))
    }));
    let in_call = Svc::new(service_fn(|_req: ToolRequest| {
        if true {
            panic!("secret argument in the panic text");
        }
        std::future::ready(Ok::<_, ToolError>(ToolResponse::new(json!("never"))))
    }));
    for tier in [in_future, in_call] {
        let svc = FallbackLayer::new().tier("mirror", tier).layer(failing(
            &p,
            ErrorKind::CircuitOpen,
            Duration::ZERO,
        ));
        // Spawned, so a panic that escapes shows as a `JoinError` instead of failing here.
        let joined = tokio::spawn(svc.oneshot(read())).await;
        let err = joined
            .expect("the tier's panic unwound into the caller's task")
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
