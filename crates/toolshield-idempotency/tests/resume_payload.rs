//! A resume token belongs to the payload whose work it names: a claim over a lapsed claim
//! with another payload never resumes that work, and the token stays for the payload it
//! belongs to; nor does a store fault on the claim that takes the work over lose it.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
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

fn pay(amount: u64, kind: CallKind) -> ToolRequest {
    ToolRequest::new("pay", json!({ "amount": amount }))
        .kind(kind)
        .idempotency_key("order-7")
}

fn key() -> String {
    storage_key("pay", None, "order-7")
}

/// A tool that records `task-<amount>` as its resume token and then works until the end
/// of time; told to resume, it answers at once with the task it resumed. `ran` lists the
/// amount of every call that reached it.
fn tool(
    ran: Arc<Mutex<Vec<Value>>>,
) -> impl tower::Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone
       + Send
       + 'static {
    service_fn(move |req: ToolRequest| {
        let ran = ran.clone();
        async move {
            let amount = req.payload()["amount"].clone();
            ran.lock().unwrap().push(amount.clone());
            let resume = req.call_state().and_then(CallState::resume).cloned();
            let resume = resume.expect("a claimed call has a handle");
            if let Some(from) = resume.resume_from() {
                return Ok(ToolResponse::new(json!({ "resumed": from })));
            }
            let token = format!("task-{amount}");
            assert_eq!(resume.record(&token).await.ok(), Some(true), "recorded");
            std::future::pending::<()>().await;
            Ok(ToolResponse::new(json!({ "started": amount })))
        }
    })
}

/// Polls `fut` until the claim carries a resume token, then forgets it: a crash.
async fn crash_once_marked<F: Future>(fut: F, store: &InMemoryIdempotencyStore) {
    let mut fut = Box::pin(fut);
    for _ in 0..100 {
        tokio::select! {
            biased;
            _ = &mut fut => panic!("the first call never ends on its own"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        if let Ok(Some(rec)) = store.get(&key()).await {
            if rec.status == RecordStatus::Pending && rec.resume.is_some() {
                #[allow(clippy::mem_forget)]
                std::mem::forget(fut);
                return;
            }
        }
    }
    panic!("the first call never marked its claim");
}

/// A first call of 42 through `svc` crashes once its claim carries a resume token, and
/// its lease lapses.
async fn crash_and_lapse<S>(svc: S, store: &InMemoryIdempotencyStore)
where
    S: tower::Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    crash_once_marked(svc.oneshot(pay(42, CallKind::Mutating)), store).await;
    advance(LEASE + LEASE / 2).await;
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_claims_work_is_never_resumed_for_another_payload() {
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let layer =
        IdempotencyLayer::with_store(IdempotencyConfig::default(), store.clone()).expect("valid");
    let ran = Arc::new(Mutex::new(Vec::new()));
    let svc = tool(ran.clone());

    crash_and_lapse(layer.layer(svc.clone()), &store).await;

    // The same key with another payload: the key is in use for the first payload (its
    // work may still be running), so this is a reuse, not a resume of someone else's work.
    let err = layer
        .layer(svc.clone())
        .oneshot(pay(99, CallKind::Mutating))
        .await
        .expect_err("another payload must not get the first payload's work");
    assert_eq!(err.kind(), ErrorKind::IdempotencyKeyReused);
    assert_eq!(*ran.lock().unwrap(), vec![json!(42)], "nothing ran for 99");

    // The payload the work belongs to still resumes it.
    let res = layer
        .layer(svc)
        .oneshot(pay(42, CallKind::Mutating))
        .await
        .expect("resumes");
    assert_eq!(res.output, json!({ "resumed": "task-42" }));
}

#[tokio::test(start_paused = true)]
async fn a_takeover_whose_claim_reply_was_lost_keeps_the_work_to_resume() {
    let plan = FaultPlan::new();
    let store = Arc::new(InMemoryIdempotencyStore::new());
    let faulty = Arc::new(FaultyStore::new(store.clone(), plan.clone()));
    let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), faulty).expect("valid");
    let ran = Arc::new(Mutex::new(Vec::new()));
    let svc = tool(ran.clone());

    crash_and_lapse(layer.layer(svc.clone()), &store).await;

    // The takeover is applied, but its reply is lost: the call fails, nothing runs.
    plan.once("claim", Fault::ApplyThenFail);
    let err = layer
        .layer(svc.clone())
        .oneshot(pay(42, CallKind::Mutating))
        .await
        .expect_err("the store failed");
    assert_eq!(err.kind(), ErrorKind::StoreUnavailable);
    tokio::time::sleep(Duration::from_millis(10)).await; // the claim's cleanup runs

    // The work the dead owner started is still there to resume, not started again.
    advance(LEASE + LEASE / 2).await;
    let next = layer.layer(svc).oneshot(pay(42, CallKind::Mutating));
    let res = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("resumed at once, not started again (a started work never ends)")
        .expect("resumes");
    assert_eq!(res.output, json!({ "resumed": "task-42" }));
    assert_eq!(
        *ran.lock().unwrap(),
        vec![json!(42), json!(42)],
        "the work started once, then was resumed"
    );
}
