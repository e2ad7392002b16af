//! `FaultyCacheStore` over the in-memory store, and the cache layer over a failing store:
//! a store failure never fails a call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, timeout};
use toolshield_cache::testing::{contract, FaultyCacheStore, OPS};
use toolshield_cache::{CacheConfig, CacheHandle, CacheLayer, CacheStore, InMemoryCacheStore};
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, Layer, ServiceExt};

const TTL: Duration = Duration::from_secs(60);

fn faulty() -> (FaultyCacheStore<InMemoryCacheStore>, FaultPlan) {
    let plan = FaultPlan::new();
    (
        FaultyCacheStore::new(InMemoryCacheStore::new(), plan.clone()),
        plan,
    )
}

fn resp(n: u64) -> ToolResponse {
    ToolResponse::new(json!({ "n": n }))
}

#[tokio::test(start_paused = true)]
async fn without_faults_the_wrapper_passes_the_store_contract() {
    contract::run_all(|| FaultyCacheStore::new(InMemoryCacheStore::new(), FaultPlan::new())).await;
}

#[tokio::test(start_paused = true)]
async fn the_plan_is_asked_once_per_operation_by_method_name() {
    assert_eq!(OPS, ["get", "put", "remove"]);
    let (store, plan) = faulty();
    for op in OPS {
        plan.once(op, Fault::Fail);
    }
    assert!(store.put("k", resp(1), TTL).await.is_err(), "put fails");
    assert!(store.get("k").await.is_err(), "get fails");
    assert!(store.remove("k").await.is_err(), "remove fails");
    assert_eq!(plan.injected(), 3);
    // Each fault was used once: the next operations go through.
    store.put("k", resp(1), TTL).await.expect("put");
    assert!(store.get("k").await.expect("get").is_some());
    assert!(store.remove("k").await.expect("remove"));
}

#[tokio::test(start_paused = true)]
async fn a_failed_operation_is_not_performed() {
    let (store, plan) = faulty();
    plan.once("put", Fault::Fail);
    assert!(store.put("k", resp(1), TTL).await.is_err());
    assert!(
        store.get_ref().get_now("k").is_none(),
        "nothing was written"
    );
    store.put("k", resp(1), TTL).await.expect("put");
    plan.once("remove", Fault::Fail);
    assert!(store.remove("k").await.is_err());
    assert!(
        store.get_ref().get_now("k").is_some(),
        "nothing was removed"
    );
}

#[tokio::test(start_paused = true)]
async fn apply_then_fail_performs_the_operation_and_reports_an_error() {
    let (store, plan) = faulty();
    plan.once("put", Fault::ApplyThenFail);
    assert!(store.put("k", resp(1), TTL).await.is_err());
    assert!(
        store.get_ref().get_now("k").is_some(),
        "written all the same"
    );
    plan.once("remove", Fault::ApplyThenFail);
    assert!(store.remove("k").await.is_err());
    assert!(
        store.get_ref().get_now("k").is_none(),
        "removed all the same"
    );
}

#[tokio::test(start_paused = true)]
async fn apply_later_reports_an_error_at_once_and_lands_after_the_delay() {
    let (store, plan) = faulty();
    plan.once("put", Fault::ApplyLater(Duration::from_secs(5)));
    assert!(store.put("k", resp(1), TTL).await.is_err());
    assert!(store.get_ref().get_now("k").is_none(), "not yet");
    sleep(Duration::from_secs(4)).await;
    assert!(store.get_ref().get_now("k").is_none(), "still not");
    sleep(Duration::from_secs(2)).await;
    assert!(
        store.get_ref().get_now("k").is_some(),
        "landed after the delay"
    );
}

#[tokio::test(start_paused = true)]
async fn delay_performs_the_operation_after_waiting() {
    let (store, plan) = faulty();
    plan.once("put", Fault::Delay(Duration::from_secs(5)));
    let early = timeout(Duration::from_secs(4), store.put("k", resp(1), TTL)).await;
    assert!(early.is_err(), "not answered before the delay");
    assert!(
        store.get_ref().get_now("k").is_none(),
        "nor performed: the put was dropped"
    );
    plan.once("put", Fault::Delay(Duration::from_secs(5)));
    timeout(Duration::from_secs(6), store.put("k", resp(1), TTL))
        .await
        .expect("answered after the delay")
        .expect("put");
    assert!(store.get_ref().get_now("k").is_some());
}

#[tokio::test(start_paused = true)]
async fn hang_never_answers_and_performs_nothing() {
    let (store, plan) = faulty();
    plan.once("put", Fault::Hang);
    let r = timeout(Duration::from_secs(3600), store.put("k", resp(1), TTL)).await;
    assert!(r.is_err(), "a hung operation never answers");
    assert!(store.get_ref().get_now("k").is_none());
}

/// A tool that counts its calls and answers with the call number.
fn counting_tool(
    calls: &Arc<AtomicUsize>,
) -> impl tower::Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static {
    let calls = Arc::clone(calls);
    service_fn(move |_req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, ToolError>(resp(n as u64)) }
    })
}

fn layer_over(store: FaultyCacheStore<InMemoryCacheStore>) -> (CacheLayer, CacheHandle) {
    let layer = CacheLayer::with_store(CacheConfig::default().with_ttl(TTL), Arc::new(store))
        .expect("valid config");
    let handle = layer.handle();
    (layer, handle)
}

fn weather() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly)
}

#[tokio::test(start_paused = true)]
async fn a_store_get_failure_calls_the_tool_and_serves_its_result() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (store, plan) = faulty();
    store.get_ref().put_now(
        &toolshield_cache::storage_key(
            "weather",
            None,
            &weather().payload_digest().expect("digest"),
        ),
        resp(0),
        TTL,
    );
    let (layer, handle) = layer_over(store);
    plan.once("get", Fault::Fail);
    let r = layer
        .layer(counting_tool(&calls))
        .oneshot(weather())
        .await
        .expect("a store failure is not the caller's error");
    assert_eq!(r.output, json!({"n": 1}), "the tool's result");
    assert!(!r.provenance.cache_hit);
    assert_eq!(handle.counts().store_errors, 1);
    // The result was written: the next call is a hit on it.
    let hit = layer
        .layer(counting_tool(&calls))
        .oneshot(weather())
        .await
        .expect("hit");
    assert!(hit.provenance.cache_hit);
    assert_eq!(hit.output, json!({"n": 1}));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_store_put_failure_still_serves_the_tools_result() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (store, plan) = faulty();
    let (layer, handle) = layer_over(store);
    plan.once("put", Fault::Fail);
    let r = layer
        .layer(counting_tool(&calls))
        .oneshot(weather())
        .await
        .expect("a store failure is not the caller's error");
    assert_eq!(r.output, json!({"n": 1}));
    assert_eq!(handle.counts().store_errors, 1);
    // Nothing was stored: the next call runs the tool again, and is then cached.
    let again = layer
        .layer(counting_tool(&calls))
        .oneshot(weather())
        .await
        .expect("ok");
    assert!(!again.provenance.cache_hit);
    assert_eq!(again.output, json!({"n": 2}));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(handle.counts().store_errors, 1);
}

#[tokio::test(start_paused = true)]
async fn random_store_faults_never_fail_a_call() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (store, plan) = faulty();
    plan.random(
        7,
        0.5,
        &["get", "put"],
        &[
            Fault::Fail,
            Fault::ApplyThenFail,
            Fault::ApplyLater(Duration::from_millis(5)),
            Fault::Delay(Duration::from_millis(5)),
        ],
    );
    let (layer, handle) = layer_over(store);
    for i in 0..200 {
        let req = ToolRequest::new("weather", json!({ "city": i % 7 })).kind(CallKind::ReadOnly);
        layer
            .layer(counting_tool(&calls))
            .oneshot(req)
            .await
            .expect("no store fault reaches the caller");
    }
    assert!(
        plan.injected() > 50,
        "faults were injected: {}",
        plan.injected()
    );
    assert!(handle.counts().store_errors > 0);
}

#[tokio::test(start_paused = true)]
async fn a_store_write_that_never_returns_holds_no_follower() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let slow_tool = service_fn(move |_req: ToolRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            sleep(Duration::from_secs(1)).await;
            Ok::<_, ToolError>(resp(n as u64))
        }
    });
    let (store, plan) = faulty();
    plan.once("put", Fault::Hang);
    let (layer, handle) = layer_over(store);
    let leader = tokio::spawn(layer.layer(slow_tool.clone()).oneshot(weather()));
    sleep(Duration::from_millis(10)).await;
    let follower = tokio::spawn(layer.layer(slow_tool.clone()).oneshot(weather()));

    let r = timeout(Duration::from_secs(10), follower)
        .await
        .expect("the follower is answered once the tool has answered, not after the write")
        .expect("task")
        .expect("the tool's result");
    assert_eq!(r.output, json!({"n": 1}));
    assert!(
        r.provenance.cache_hit,
        "the tool did not run for the follower"
    );

    // While the write hangs, a later call is answered by the flight, without the tool.
    let later = timeout(
        Duration::from_secs(10),
        layer.layer(slow_tool.clone()).oneshot(weather()),
    )
    .await
    .expect("a later caller is not held by the write either")
    .expect("the tool's result");
    assert_eq!(later.output, json!({"n": 1}));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the tool ran once");
    assert_eq!(handle.counts().coalesced, 2);
    leader.abort();
}
