//! The resume handle the layer installs on a call it claimed: a token recorded by the
//! inner service reaches the owner that takes the claim over after a crash.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{
    CallKind, CallState, ErrorKind, ShieldRequest, ToolError, ToolRequest, ToolResponse,
};
use toolshield_idempotency::testing::FaultyStore;
use toolshield_idempotency::{
    storage_key, IdempotencyConfig, IdempotencyLayer, IdempotencyStore, InMemoryIdempotencyStore,
    RecordStatus,
};
use tower::{service_fn, Layer, ServiceExt};

const LEASE: Duration = Duration::from_secs(30);

fn pay() -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": 42}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-7")
}

fn key() -> String {
    storage_key("pay", None, "order-7")
}

/// What the inner service saw of the handle on each call: `None` without a handle, else
/// the token it was told to resume from.
type Seen = Arc<Mutex<Vec<Option<Option<String>>>>>;

fn seen_on(req: &ToolRequest, seen: &Seen) {
    let handle = req.call_state().and_then(CallState::resume);
    seen.lock()
        .unwrap()
        .push(handle.map(|r| r.resume_from().map(str::to_owned)));
}

/// A tool that records `token` (when it starts the work) and then works until the end of
/// time; when told to resume, it answers at once with what it resumed.
fn crashing_tool(
    seen: Seen,
    token: Option<&'static str>,
) -> impl tower::Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone
       + Send
       + 'static {
    service_fn(move |req: ToolRequest| {
        let seen = seen.clone();
        async move {
            seen_on(&req, &seen);
            let resume = req.call_state().and_then(CallState::resume).cloned();
            if let Some(from) = resume.as_ref().and_then(|r| r.resume_from()) {
                return Ok(ToolResponse::new(json!({ "resumed": from })));
            }
            if let (Some(resume), Some(token)) = (resume, token) {
                assert_eq!(resume.record(token).await.ok(), Some(true), "recorded");
            }
            std::future::pending::<()>().await;
            Ok(ToolResponse::new(json!({ "started": true })))
        }
    })
}

/// Polls `fut` until the store shows the claim (marked, when `marked`), then forgets it:
/// the process "dies" with no cleanup, as a crash leaves it.
async fn crash_after_claim<F: Future>(fut: F, store: &InMemoryIdempotencyStore, marked: bool) {
    let mut fut = Box::pin(fut);
    for _ in 0..100 {
        tokio::select! {
            biased;
            _ = &mut fut => panic!("the first call never ends on its own"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        if let Ok(Some(rec)) = store.get(&key()).await {
            if rec.status == RecordStatus::Pending && (!marked || rec.resume.is_some()) {
                // The crash itself: no drop guard of the call may run.
                #[allow(clippy::mem_forget)]
                std::mem::forget(fut);
                return;
            }
        }
    }
    panic!("the first call never claimed the key");
}

#[tokio::test(start_paused = true)]
async fn a_token_recorded_before_a_crash_reaches_the_owner_that_takes_over() {
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let layer =
        IdempotencyLayer::with_store(IdempotencyConfig::default(), store.clone()).expect("valid");
    let handle = layer.handle();
    let seen = Seen::default();
    let svc = crashing_tool(seen.clone(), Some("task-1"));

    crash_after_claim(layer.layer(svc.clone()).oneshot(pay()), &store, true).await;
    let rec = store.get(&key()).await.unwrap().expect("the claim is left");
    assert_eq!(
        rec.resume.as_deref(),
        Some("task-1"),
        "the token is on the claim"
    );

    advance(LEASE + LEASE / 2).await;
    let res = layer
        .layer(svc)
        .oneshot(pay())
        .await
        .expect("the taker resumes");

    assert_eq!(res.output, json!({ "resumed": "task-1" }));
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Some(None), Some(Some("task-1".to_owned()))],
        "the first call starts the work, the taker resumes it"
    );
    assert_eq!(handle.counts().takeovers, 1);
    let rec = store.get(&key()).await.unwrap().expect("the outcome");
    assert_eq!(rec.status, RecordStatus::Completed);
    assert_eq!(rec.resume, None, "the outcome replaces the mark");
}

#[tokio::test(start_paused = true)]
async fn a_takeover_without_a_token_starts_the_work_again() {
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let layer =
        IdempotencyLayer::with_store(IdempotencyConfig::default(), store.clone()).expect("valid");
    let handle = layer.handle();
    let seen = Seen::default();

    crash_after_claim(
        layer
            .layer(crashing_tool(seen.clone(), None))
            .oneshot(pay()),
        &store,
        false,
    )
    .await;
    advance(LEASE + LEASE / 2).await;
    let svc = service_fn({
        let seen = seen.clone();
        move |req: ToolRequest| {
            seen_on(&req, &seen);
            async { Ok::<_, ToolError>(ToolResponse::new(json!({ "started": "again" }))) }
        }
    });
    let res = layer.layer(svc).oneshot(pay()).await.expect("runs again");

    assert_eq!(res.output, json!({ "started": "again" }));
    assert_eq!(*seen.lock().unwrap(), vec![Some(None), Some(None)]);
    assert_eq!(handle.counts().takeovers, 1);
    assert_eq!(handle.counts().executions, 2);
}

#[tokio::test(start_paused = true)]
async fn calls_the_layer_does_not_claim_get_no_handle() {
    let layer = IdempotencyLayer::new(IdempotencyConfig::default()).expect("valid");
    let seen = Seen::default();
    let svc = service_fn({
        let seen = seen.clone();
        move |req: ToolRequest| {
            seen_on(&req, &seen);
            async { Ok::<_, ToolError>(ToolResponse::new(json!({}))) }
        }
    });
    let read = ToolRequest::new("pay", json!({"amount": 42})).kind(CallKind::ReadOnly);
    layer.layer(svc.clone()).oneshot(read).await.expect("read");
    svc.clone().oneshot(pay()).await.expect("no layer");
    layer
        .layer(svc.clone())
        .oneshot(pay())
        .await
        .expect("claimed");
    layer.layer(svc).oneshot(pay()).await.expect("replayed");

    assert_eq!(
        *seen.lock().unwrap(),
        vec![None, None, Some(None)],
        "only the claimed call has a handle; a replay calls nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn hostile_tokens_are_refused_and_the_call_goes_on() {
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let layer =
        IdempotencyLayer::with_store(IdempotencyConfig::default(), store.clone()).expect("valid");
    let checked = Arc::new(Mutex::new(Vec::new()));
    let svc = service_fn({
        let (store, checked) = (store.clone(), checked.clone());
        move |req: ToolRequest| {
            let (store, checked) = (store.clone(), checked.clone());
            async move {
                let resume = req
                    .call_state()
                    .and_then(CallState::resume)
                    .expect("a claimed call has a handle");
                for bad in ["", "a\nb", "\u{1b}[2J", &"t".repeat(1 << 20)] {
                    let err = resume.record(bad).await.expect_err("refused");
                    checked.lock().unwrap().push(err.kind());
                }
                let rec = store.get(&key()).await.unwrap().expect("the claim");
                assert_eq!(rec.resume, None, "nothing was written");
                Ok::<_, ToolError>(ToolResponse::new(json!({ "done": true })))
            }
        }
    });

    let res = layer
        .layer(svc)
        .oneshot(pay())
        .await
        .expect("the call goes on");

    assert_eq!(res.output, json!({ "done": true }));
    assert_eq!(*checked.lock().unwrap(), vec![ErrorKind::InvalidInput; 4]);
}

#[tokio::test(start_paused = true)]
async fn a_token_is_not_recorded_on_a_claim_the_call_lost() {
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let layer =
        IdempotencyLayer::with_store(IdempotencyConfig::default(), store.clone()).expect("valid");
    let answers = Arc::new(Mutex::new(Vec::new()));
    let svc = service_fn({
        let (store, answers) = (store.clone(), answers.clone());
        move |req: ToolRequest| {
            let (store, answers) = (store.clone(), answers.clone());
            async move {
                let resume = req.call_state().and_then(CallState::resume).cloned();
                let resume = resume.expect("a handle");
                // An operator forgets the key while the call runs.
                assert!(store.remove(&key()).await.unwrap());
                let answer = resume.record("task-1").await.ok();
                answers.lock().unwrap().push(answer);
                Err::<ToolResponse, _>(ToolError::new(ErrorKind::InvalidInput, "bad"))
            }
        }
    });

    let _ = layer.layer(svc).oneshot(pay()).await;

    assert_eq!(*answers.lock().unwrap(), vec![Some(false)], "fenced off");
    assert!(
        store.get(&key()).await.unwrap().is_none(),
        "nothing was written for the lost claim"
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_failure_while_recording_is_an_error_the_call_may_ignore() {
    let plan = FaultPlan::new();
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let faulty = Arc::new(FaultyStore::new(store.clone(), plan.clone()));
    let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), faulty).expect("valid");
    let handle = layer.handle();
    plan.once("mark_resume", Fault::Fail);
    let kinds = Arc::new(Mutex::new(Vec::new()));
    let svc = service_fn({
        let kinds = kinds.clone();
        move |req: ToolRequest| {
            let kinds = kinds.clone();
            async move {
                let resume = req.call_state().and_then(CallState::resume).cloned();
                let err = resume
                    .expect("a handle")
                    .record("task-1")
                    .await
                    .expect_err("the store failed");
                kinds.lock().unwrap().push(err.kind());
                Ok::<_, ToolError>(ToolResponse::new(json!({ "done": true })))
            }
        }
    });

    let res = layer.layer(svc).oneshot(pay()).await.expect("completes");

    assert_eq!(res.output, json!({ "done": true }));
    assert_eq!(*kinds.lock().unwrap(), vec![ErrorKind::StoreUnavailable]);
    assert_eq!(handle.counts().store_errors, 1);
    let rec = store.get(&key()).await.unwrap().expect("the outcome");
    assert_eq!(rec.status, RecordStatus::Completed);
}

#[tokio::test(start_paused = true)]
async fn a_resumed_call_that_fails_retriably_leaves_its_claim_to_lapse_not_free() {
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let layer =
        IdempotencyLayer::with_store(IdempotencyConfig::default(), store.clone()).expect("valid");
    let handle = layer.handle();
    let seen = Seen::default();
    crash_after_claim(
        layer
            .layer(crashing_tool(seen.clone(), Some("task-1")))
            .oneshot(pay()),
        &store,
        true,
    )
    .await;
    advance(LEASE + LEASE / 2).await;

    // The taker resumes, but its connection to the work is down: a retriable failure.
    let down = service_fn({
        let seen = seen.clone();
        move |req: ToolRequest| {
            seen_on(&req, &seen);
            async {
                Err::<ToolResponse, _>(ToolError::new(
                    ErrorKind::ConnectionFailed,
                    "transport closed before polling",
                ))
            }
        }
    });
    let err = layer.layer(down).oneshot(pay()).await.expect_err("down");
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    let rec = store.get(&key()).await.unwrap().expect("not released");
    assert_eq!(rec.status, RecordStatus::Pending);
    assert_eq!(
        rec.resume.as_deref(),
        Some("task-1"),
        "the work to resume is still on the claim"
    );

    // Once that claim lapses, the next call resumes the same work.
    advance(LEASE + LEASE / 2).await;
    let res = layer
        .layer(crashing_tool(seen.clone(), None))
        .oneshot(pay())
        .await
        .expect("resumes");
    assert_eq!(res.output, json!({ "resumed": "task-1" }));
    assert_eq!(handle.counts().takeovers, 2);
    assert_eq!(
        seen.lock().unwrap().last(),
        Some(&Some(Some("task-1".to_owned())))
    );
}
