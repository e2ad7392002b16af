//! A flight's leader that ends for a reason of its own (its deadline, a panic unwinding
//! through it) hands its followers no error and leaves none of them waiting: one of them
//! leads a new flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, Instant};
use toolshield_cache::{CacheConfig, CacheLayer};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::BoxedTool;
use tower::{service_fn, Layer, ServiceExt};

fn weather() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly)
}

fn layer() -> CacheLayer {
    CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(60))).expect("valid config")
}

/// A tool taking 5 s, cut with `TIMEOUT` at the request's deadline, as the attempt
/// timeout inside the cache cuts it.
fn deadline_bound_tool(calls: &Arc<AtomicUsize>) -> BoxedTool {
    let calls = Arc::clone(calls);
    BoxedTool::new(service_fn(move |req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
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
    }))
}

#[tokio::test(start_paused = true)]
async fn a_leaders_own_deadline_never_becomes_its_followers_timeout() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = deadline_bound_tool(&calls);
    let layer = layer();
    let leader_req = weather().deadline(Instant::now() + Duration::from_secs(1));
    let leader = tokio::spawn(layer.layer(svc.clone()).oneshot(leader_req));
    sleep(Duration::from_millis(10)).await;
    let mut followers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        followers.spawn(layer.layer(svc.clone()).oneshot(weather()));
    }

    let err = leader
        .await
        .expect("task")
        .expect_err("the leader's budget runs out");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let mut n = 0;
    while let Some(r) = followers.join_next().await {
        let r = r
            .expect("task")
            .expect("a follower without a deadline is not cut by the leader's");
        assert_eq!(r.output, json!({"n": 2}), "the result of a second flight");
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one new flight for all three"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tool_timeout_within_the_leaders_deadline_is_shared() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = BoxedTool::new(service_fn(move |_req: ToolRequest| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            sleep(Duration::from_secs(1)).await;
            Err::<ToolResponse, _>(ToolError::timeout("attempt exceeded 1s"))
        }
    }));
    let layer = layer();
    let leader_req = weather().deadline(Instant::now() + Duration::from_secs(60));
    let leader = tokio::spawn(layer.layer(svc.clone()).oneshot(leader_req));
    sleep(Duration::from_millis(10)).await;
    let follower = tokio::spawn(layer.layer(svc.clone()).oneshot(weather()));
    for r in [leader.await, follower.await] {
        let err = r.expect("task").expect_err("the tool timed out");
        assert_eq!(err.kind(), ErrorKind::Timeout);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the tool's own timeout is shared"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_unwinding_from_a_panic_hands_over_to_its_followers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = BoxedTool::new(service_fn(move |_req: ToolRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            sleep(Duration::from_secs(1)).await;
            if n == 1 {
                panic!("the first call panics");
            }
            Ok::<_, ToolError>(ToolResponse::new(json!({ "n": n })))
        }
    }));
    let layer = layer();
    let leader = tokio::spawn(layer.layer(svc.clone()).oneshot(weather()));
    sleep(Duration::from_millis(10)).await;
    let mut followers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        followers.spawn(layer.layer(svc.clone()).oneshot(weather()));
    }
    assert!(
        leader.await.expect_err("the panic").is_panic(),
        "the leader's task panicked"
    );
    let mut n = 0;
    while let Some(r) = followers.join_next().await {
        let r = r.expect("task").expect("a follower takes over");
        assert_eq!(r.output, json!({"n": 2}));
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A tool behind a limit keyed by caller (a rate limit or bulkhead with `ByCaller`, as
/// the stack puts inside the cache): after 1 s it refuses `alice`, whose quota is spent,
/// with `refusal`, and answers every other caller.
fn limited_for_alice(calls: &Arc<AtomicUsize>, refusal: ErrorKind) -> BoxedTool {
    let calls = Arc::clone(calls);
    BoxedTool::new(service_fn(move |req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let alice = req.meta().caller_id.as_deref() == Some("alice");
        async move {
            sleep(Duration::from_secs(1)).await;
            if alice {
                Err(ToolError::new(refusal, "alice's quota is spent"))
            } else {
                Ok(ToolResponse::new(json!({ "n": n })))
            }
        }
    }))
}

#[tokio::test(start_paused = true)]
async fn a_refusal_keyed_by_caller_never_reaches_another_callers_follower() {
    for refusal in [ErrorKind::RateLimited, ErrorKind::Overloaded] {
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = limited_for_alice(&calls, refusal);
        let layer = layer();
        let alice = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("alice")));
        sleep(Duration::from_millis(10)).await;
        let bob = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("bob")));
        let alice_again = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("alice")));

        let err = alice.await.expect("task").expect_err("alice is refused");
        assert_eq!(err.kind(), refusal);
        let err = alice_again
            .await
            .expect("task")
            .expect_err("the same caller shares its own refusal");
        assert_eq!(err.kind(), refusal);
        let ok = bob
            .await
            .expect("task")
            .unwrap_or_else(|e| panic!("bob has a quota of his own: {e}"));
        assert_eq!(ok.output, json!({"n": 2}), "bob led a flight of his own");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{refusal:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn other_failures_are_shared_with_every_follower() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = limited_for_alice(&calls, ErrorKind::UpstreamUnavailable);
    let layer = layer();
    let alice = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("alice")));
    sleep(Duration::from_millis(10)).await;
    let bob = tokio::spawn(layer.layer(svc.clone()).oneshot(weather().caller("bob")));
    for r in [alice.await, bob.await] {
        let err = r
            .expect("task")
            .expect_err("the upstream is down for everyone");
        assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_follower_leaves_at_its_own_deadline_while_the_leader_runs_on() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = BoxedTool::new(service_fn(move |_req: ToolRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            sleep(Duration::from_secs(10)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!({ "n": n })))
        }
    }));
    let layer = layer();
    let leader = tokio::spawn(layer.layer(svc.clone()).oneshot(weather()));
    sleep(Duration::from_millis(10)).await;
    let start = Instant::now();
    let follower_req = weather().deadline(start + Duration::from_secs(1));
    let err = layer
        .layer(svc.clone())
        .oneshot(follower_req)
        .await
        .expect_err("the follower's deadline comes first");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(1),
        "the follower left at its deadline, not when the leader's call ended"
    );
    let ok = leader.await.expect("task").expect("the leader runs on");
    assert_eq!(ok.output, json!({"n": 1}));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A follower whose deadline has passed leaves at once.
    let leader =
        tokio::spawn(layer.layer(svc.clone()).oneshot(
            ToolRequest::new("weather", json!({"city": "Oslo"})).kind(CallKind::ReadOnly),
        ));
    sleep(Duration::from_millis(10)).await;
    let start = Instant::now();
    let late = ToolRequest::new("weather", json!({"city": "Oslo"}))
        .kind(CallKind::ReadOnly)
        .deadline(start - Duration::from_millis(5));
    let err = layer
        .layer(svc.clone())
        .oneshot(late)
        .await
        .expect_err("past its deadline");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), Duration::ZERO);
    leader.await.expect("task").expect("the leader runs on");
}
