//! What a flight's leader ends with for a reason of its caller's own (its credentials,
//! its quota, its deadline) never reaches a follower of another caller: not as the error,
//! and not as the stale entry the leader was answered with instead.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, Instant};
use toolshield_cache::{storage_key, CacheConfig, CacheLayer, InMemoryCacheStore};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::BoxedTool;
use tower::{service_fn, Layer, ServiceExt};

fn weather() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly)
}

/// After 1 s, refuses `alice` with `refusal` and answers every other caller with the
/// call's number.
fn refuses_alice(calls: &Arc<AtomicUsize>, refusal: ErrorKind) -> BoxedTool {
    let calls = Arc::clone(calls);
    BoxedTool::new(service_fn(move |req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let alice = req.meta().caller_id.as_deref() == Some("alice");
        async move {
            sleep(Duration::from_secs(1)).await;
            if alice {
                Err(ToolError::new(refusal, "refused for alice"))
            } else {
                Ok(ToolResponse::new(json!({ "n": n })))
            }
        }
    }))
}

/// A layer with a 60 s TTL and a 600 s grace over `store`.
fn layer_over(store: &Arc<InMemoryCacheStore>) -> CacheLayer {
    CacheLayer::with_store(
        CacheConfig::default()
            .with_ttl(Duration::from_secs(60))
            .with_stale_if_error(Duration::from_secs(600)),
        Arc::clone(store) as _,
    )
    .expect("valid config")
}

/// A stale entry for `weather()` (300 s left, within the 600 s grace).
fn stale_entry(store: &InMemoryCacheStore) {
    let key = storage_key(
        "weather",
        None,
        &weather().payload_digest().expect("digest"),
    );
    store.put_now(
        &key,
        ToolResponse::new(json!({"old": true})),
        Duration::from_secs(300),
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_of_one_callers_credentials_never_reaches_another_callers_follower() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = refuses_alice(&calls, ErrorKind::Unauthorized);
    let layer = layer_over(&Arc::new(InMemoryCacheStore::new()));
    let alice = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("alice")));
    sleep(Duration::from_millis(10)).await;
    let bob = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("bob")));
    let alice_again = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("alice")));

    let err = alice.await.expect("task").expect_err("alice is refused");
    assert_eq!(err.kind(), ErrorKind::Unauthorized);
    let err = alice_again
        .await
        .expect("task")
        .expect_err("the same caller shares its own refusal");
    assert_eq!(err.kind(), ErrorKind::Unauthorized);
    let ok = bob
        .await
        .expect("task")
        .unwrap_or_else(|e| panic!("bob's access is his own: {e}"));
    assert_eq!(ok.output, json!({"n": 2}), "bob led a flight of his own");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stale_answer_to_one_callers_refusal_never_reaches_another_callers_follower() {
    for refusal in [ErrorKind::RateLimited, ErrorKind::Overloaded] {
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = refuses_alice(&calls, refusal);
        let store = Arc::new(InMemoryCacheStore::new());
        stale_entry(&store);
        let layer = layer_over(&store);
        let alice = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("alice")));
        sleep(Duration::from_millis(10)).await;
        let bob = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("bob")));
        let alice_again = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("alice")));

        for r in [alice.await, alice_again.await] {
            let stale = r.expect("task").expect("alice is answered from the cache");
            assert!(
                stale.provenance.stale,
                "{refusal:?}: alice's answer is stale"
            );
            assert_eq!(stale.output, json!({"old": true}));
        }
        let fresh = bob.await.expect("task").expect("bob is answered");
        assert!(
            !fresh.provenance.stale,
            "{refusal:?}: bob was handed the stale answer to alice's refusal"
        );
        assert_eq!(fresh.output, json!({"n": 2}), "bob led a flight of his own");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn a_stale_answer_to_the_leaders_deadline_never_reaches_its_followers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    // Takes 5 s, cut with `TIMEOUT` at the request's deadline (the attempt timeout's work).
    let svc = BoxedTool::new(service_fn(move |req: ToolRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let deadline = req.deadline_at();
        async move {
            let work = sleep(Duration::from_secs(5));
            match deadline {
                Some(at) => tokio::select! {
                    _ = work => Ok(ToolResponse::new(json!({ "n": n }))),
                    _ = tokio::time::sleep_until(at) => {
                        Err(ToolError::timeout("call reached its deadline"))
                    }
                },
                None => {
                    work.await;
                    Ok(ToolResponse::new(json!({ "n": n })))
                }
            }
        }
    }));
    let store = Arc::new(InMemoryCacheStore::new());
    stale_entry(&store);
    let layer = layer_over(&store);
    let leader_req = weather().deadline(Instant::now() + Duration::from_secs(1));
    let leader = tokio::spawn(layer.layer(svc.clone()).oneshot(leader_req));
    sleep(Duration::from_millis(10)).await;
    let follower = tokio::spawn(layer.layer(svc.clone()).oneshot(weather()));

    let stale = leader.await.expect("task").expect("the leader gets stale");
    assert!(stale.provenance.stale);
    let fresh = follower
        .await
        .expect("task")
        .expect("the follower is answered");
    assert!(
        !fresh.provenance.stale,
        "a follower without a deadline was handed the leader's stale answer"
    );
    assert_eq!(fresh.output, json!({"n": 2}));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
