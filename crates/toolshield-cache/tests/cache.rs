//! Behaviour of the cache layer, on a paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::{json, Value};
use tokio::time::{advance, sleep};
use toolshield_cache::{CacheConfig, CacheHandle, CacheLayer, PerUser};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{counting_tool, BoxedTool};
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxedTool;

fn ok_n(n: usize) -> Result<ToolResponse, ToolError> {
    Ok(ToolResponse::new(json!({ "n": n })))
}

/// The first execution answers, every later one is refused.
fn ok_once_then_refused(n: usize) -> Result<ToolResponse, ToolError> {
    if n == 1 {
        ok_n(n)
    } else {
        Err(ToolError::new(ErrorKind::ConnectionFailed, "refused"))
    }
}

fn weather() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris", "units": "metric"}))
        .kind(CallKind::ReadOnly)
}

fn layer(ttl: Duration, grace: Duration) -> (CacheLayer, CacheHandle) {
    let cfg = CacheConfig::default()
        .with_ttl(ttl)
        .with_stale_if_error(grace);
    let layer = CacheLayer::new(cfg).expect("valid config");
    let handle = layer.handle();
    (layer, handle)
}

async fn call(svc: &Svc, layer: &CacheLayer, req: ToolRequest) -> Result<ToolResponse, ToolError> {
    layer.layer(svc.clone()).oneshot(req).await
}

fn n_of(r: &ToolResponse) -> Value {
    r.output["n"].clone()
}

#[tokio::test(start_paused = true)]
async fn miss_then_hit_runs_the_tool_once() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, handle) = layer(Duration::from_secs(60), Duration::ZERO);

    let first = call(&svc, &layer, weather()).await.expect("miss");
    assert!(!first.provenance.cache_hit, "a miss is not a cache hit");
    // Same payload, keys in another order: same key.
    let reordered = ToolRequest::new("weather", json!({"units": "metric", "city": "Paris"}))
        .kind(CallKind::ReadOnly);
    let second = call(&svc, &layer, reordered).await.expect("hit");
    assert!(second.provenance.cache_hit, "a hit is marked cache_hit");
    assert_eq!(n_of(&second), json!(1));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let c = handle.counts();
    assert_eq!((c.hits, c.misses), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn hit_keeps_the_original_fetched_at() {
    let calls = Arc::new(AtomicUsize::new(0));
    let at = Utc
        .with_ymd_and_hms(2025, 1, 15, 12, 0, 0)
        .single()
        .expect("date");
    let svc = counting_tool(&calls, Duration::ZERO, move |n| {
        let mut r = ToolResponse::new(json!({ "n": n }));
        r.provenance.fetched_at = Some(at);
        Ok(r)
    });
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    call(&svc, &layer, weather()).await.expect("miss");
    advance(Duration::from_secs(30)).await;
    let hit = call(&svc, &layer, weather()).await.expect("hit");
    assert!(hit.provenance.cache_hit);
    assert_eq!(
        hit.provenance.fetched_at,
        Some(at),
        "a hit keeps the original fetched_at"
    );
}

#[tokio::test(start_paused = true)]
async fn miss_stamps_fetched_at_and_hit_returns_it() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    let first = call(&svc, &layer, weather()).await.expect("miss");
    let stamped = first
        .provenance
        .fetched_at
        .expect("a miss stamps fetched_at");
    let hit = call(&svc, &layer, weather()).await.expect("hit");
    assert_eq!(hit.provenance.fetched_at, Some(stamped));
}

#[tokio::test(start_paused = true)]
async fn a_caller_writing_to_its_hit_changes_nothing_another_caller_is_served() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, |n| {
        let mut r = ToolResponse::new(json!({ "n": n }));
        r.provenance.source = Some(Arc::from("weather-api"));
        Ok(r)
    });
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    let leader = call(&svc, &layer, weather()).await.expect("miss");

    // A caller rewrites everything it was served: provenance and output.
    let mut first = call(&svc, &layer, weather()).await.expect("hit");
    assert!(first.provenance.cache_hit);
    first.provenance.cache_hit = false;
    first.provenance.source = Some(Arc::from("forged"));
    first.provenance.attempts = 9;
    first.provenance.stale = true;
    first.output["n"] = json!(666);

    // The next caller is served the entry as it was kept.
    let second = call(&svc, &layer, weather()).await.expect("hit");
    assert!(second.provenance.cache_hit && !second.provenance.stale);
    assert_eq!(second.provenance.source.as_deref(), Some("weather-api"));
    assert_eq!(second.provenance.attempts, leader.provenance.attempts);
    assert_eq!(second.provenance.fetched_at, leader.provenance.fetched_at);
    assert_eq!(n_of(&second), json!(1));
    // The leader's own answer, a miss, is not marked a hit.
    assert!(!leader.provenance.cache_hit);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn entries_expire_after_their_ttl() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    call(&svc, &layer, weather()).await.expect("miss");
    advance(Duration::from_secs(59)).await;
    assert!(
        call(&svc, &layer, weather())
            .await
            .expect("hit")
            .provenance
            .cache_hit
    );
    advance(Duration::from_secs(2)).await;
    let after = call(&svc, &layer, weather())
        .await
        .expect("miss after expiry");
    assert!(!after.provenance.cache_hit, "an expired entry is a miss");
    assert_eq!(n_of(&after), json!(2));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn ttl_zero_turns_caching_off() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, handle) = layer(Duration::ZERO, Duration::ZERO);
    for _ in 0..3 {
        let r = call(&svc, &layer, weather()).await.expect("ok");
        assert!(!r.provenance.cache_hit);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        handle.counts().misses,
        0,
        "TTL 0: the layer is a pass-through"
    );
}

#[tokio::test(start_paused = true)]
async fn only_read_only_calls_are_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    for kind in [CallKind::Mutating, CallKind::Idempotent] {
        let req = ToolRequest::new("weather", json!({"city": "Paris"})).kind(kind);
        call(&svc, &layer, req.clone()).await.expect("ok");
        let again = call(&svc, &layer, req).await.expect("ok");
        assert!(!again.provenance.cache_hit, "{kind} calls are never cached");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn errors_are_never_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, |n| {
        if n == 1 {
            Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
        } else if n == 2 {
            Ok(ToolResponse::new(json!({"isError": true, "n": n})))
        } else {
            ok_n(n)
        }
    });
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    let e = call(&svc, &layer, weather())
        .await
        .expect_err("first call fails");
    assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
    let in_band = call(&svc, &layer, weather())
        .await
        .expect("in-band error response");
    assert!(in_band.is_error() && !in_band.provenance.cache_hit);
    let third = call(&svc, &layer, weather()).await.expect("ok");
    assert_eq!(n_of(&third), json!(3), "neither error was cached");
    let fourth = call(&svc, &layer, weather()).await.expect("hit");
    assert!(fourth.provenance.cache_hit);
    assert_eq!(n_of(&fourth), json!(3));
}

#[tokio::test(start_paused = true)]
async fn stale_if_error_within_the_grace_then_not_after() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_once_then_refused);
    let (layer, handle) = layer(Duration::from_secs(10), Duration::from_secs(60));
    let fresh = call(&svc, &layer, weather()).await.expect("miss");
    // Still fresh: a plain hit, not stale.
    advance(Duration::from_secs(5)).await;
    let hit = call(&svc, &layer, weather()).await.expect("hit");
    assert!(hit.provenance.cache_hit && !hit.provenance.stale);
    // Past the TTL, inside the grace: the tool is called, fails, the stale entry is served.
    advance(Duration::from_secs(20)).await;
    let stale = call(&svc, &layer, weather()).await.expect("stale entry");
    assert!(stale.provenance.stale, "served past its TTL: stale");
    assert!(stale.provenance.cache_hit);
    assert_eq!(stale.provenance.fetched_at, fresh.provenance.fetched_at);
    assert_eq!(n_of(&stale), json!(1));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the tool was tried first");
    assert_eq!(handle.counts().stale, 1);
    // Past the grace: the error goes through.
    advance(Duration::from_secs(60)).await;
    let e = call(&svc, &layer, weather())
        .await
        .expect_err("past the grace");
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
}

#[tokio::test(start_paused = true)]
async fn stale_if_error_serves_during_an_open_circuit_but_not_on_invalid_input() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, |n| match n {
        1 => ok_n(n),
        2 => Err(ToolError::new(
            ErrorKind::CircuitOpen,
            "circuit open for tool `weather`",
        )),
        _ => Err(ToolError::invalid_input("bad city")),
    });
    let (layer, _) = layer(Duration::from_secs(10), Duration::from_secs(60));
    call(&svc, &layer, weather()).await.expect("miss");
    advance(Duration::from_secs(11)).await;
    let stale = call(&svc, &layer, weather())
        .await
        .expect("stale during open circuit");
    assert!(stale.provenance.stale);
    let e = call(&svc, &layer, weather())
        .await
        .expect_err("invalid input is not masked");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
}

#[tokio::test(start_paused = true)]
async fn single_flight_100_concurrent_misses_run_once() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(1), ok_n);
    let (layer, handle) = layer(Duration::from_secs(60), Duration::ZERO);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let s = layer.layer(svc.clone());
        set.spawn(s.oneshot(weather()));
    }
    let mut outputs = Vec::new();
    while let Some(r) = set.join_next().await {
        outputs.push(r.expect("task").expect("every caller gets the result"));
    }
    assert_eq!(outputs.len(), 100);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "exactly one execution");
    assert!(outputs.iter().all(|r| r.output == json!({"n": 1})));
    let c = handle.counts();
    assert_eq!((c.misses, c.coalesced), (1, 99));
}

#[tokio::test(start_paused = true)]
async fn single_flight_errors_are_shared_but_not_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(1), |n| {
        if n == 1 {
            Err(ToolError::new(ErrorKind::Timeout, "slow"))
        } else {
            ok_n(n)
        }
    });
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..10 {
        set.spawn(layer.layer(svc.clone()).oneshot(weather()));
    }
    while let Some(r) = set.join_next().await {
        assert_eq!(
            r.expect("task").expect_err("shared error").kind(),
            ErrorKind::Timeout
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let next = call(&svc, &layer, weather()).await.expect("runs again");
    assert_eq!(n_of(&next), json!(2));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_takes_over_when_the_leader_is_cancelled() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::from_secs(5), ok_n);
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    let leader = tokio::spawn(layer.layer(svc.clone()).oneshot(weather()));
    sleep(Duration::from_millis(10)).await;
    let mut followers = tokio::task::JoinSet::new();
    for _ in 0..5 {
        followers.spawn(layer.layer(svc.clone()).oneshot(weather()));
    }
    sleep(Duration::from_secs(1)).await;
    leader.abort();
    let mut n = 0;
    while let Some(r) = followers.join_next().await {
        let r = r
            .expect("task")
            .expect("a follower takes over: nobody hangs");
        assert_eq!(n_of(&r), json!(2));
        n += 1;
    }
    assert_eq!(n, 5);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the leader's call, then one take-over"
    );
}

#[tokio::test(start_paused = true)]
async fn per_user_requests_are_namespaced_by_caller() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    let alice = weather().caller("alice").extension(PerUser);
    let bob = weather().caller("bob").extension(PerUser);
    call(&svc, &layer, alice.clone()).await.expect("alice");
    let b = call(&svc, &layer, bob).await.expect("bob");
    assert!(!b.provenance.cache_hit, "bob does not see alice's entry");
    assert!(
        call(&svc, &layer, alice)
            .await
            .expect("alice")
            .provenance
            .cache_hit
    );
    // Untagged requests share one entry across callers.
    let shared = call(&svc, &layer, weather().caller("carol"))
        .await
        .expect("carol");
    assert!(!shared.provenance.cache_hit);
    assert!(
        call(&svc, &layer, weather().caller("dave"))
            .await
            .expect("dave")
            .provenance
            .cache_hit
    );
}

#[test]
fn config_is_validated_and_strict() {
    let bad: Result<CacheConfig, _> = serde_json::from_str(r#"{"tll": "1s"}"#);
    assert!(bad.is_err(), "unknown fields are rejected");
    let cfg: CacheConfig =
        serde_json::from_str(r#"{"ttl": "400d", "stale_if_error": "500d"}"#).expect("parses");
    let err = cfg.validate().expect_err("too long");
    assert_eq!(err.problems().len(), 2, "every problem is listed: {err}");
    assert!(CacheLayer::new(cfg).is_err());
}

/// A tool that honours its attempt token, as tools are told to: the first call runs
/// until it is cancelled (then answers `CANCELLED`), later calls take a second.
fn honouring_tool(calls: &Arc<AtomicUsize>) -> Svc {
    let calls = Arc::clone(calls);
    BoxedTool::new(service_fn(move |req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let token = req.attempt_token().clone();
        async move {
            let work = Duration::from_secs(if n == 1 { 3600 } else { 1 });
            tokio::select! {
                _ = token.cancelled() => Err(ToolError::cancelled("the call was cancelled")),
                _ = sleep(work) => ok_n(n),
            }
        }
    }))
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_leader_does_not_cancel_its_followers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = honouring_tool(&calls);
    let (layer, handle) = layer(Duration::from_secs(60), Duration::ZERO);
    let leader_req = weather();
    let leader_token = leader_req.call_token().clone();
    let leader = tokio::spawn(layer.layer(svc.clone()).oneshot(leader_req));
    sleep(Duration::from_millis(10)).await;
    let mut followers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        followers.spawn(layer.layer(svc.clone()).oneshot(weather()));
    }
    sleep(Duration::from_millis(10)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the followers wait");

    leader_token.cancel();
    let err = leader
        .await
        .expect("task")
        .expect_err("the leader's own call is cancelled");
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    let mut n = 0;
    while let Some(r) = followers.join_next().await {
        let r = r
            .expect("task")
            .expect("a follower never gets the leader's cancellation");
        assert_eq!(
            n_of(&r),
            json!(2),
            "the tool's real result, from a second flight"
        );
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the cancelled call, then one new flight"
    );
    assert_eq!(handle.counts().misses, 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_leader_future_hands_over_to_a_follower() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = honouring_tool(&calls);
    let (layer, _) = layer(Duration::from_secs(60), Duration::ZERO);
    let mut leader = Box::pin(layer.layer(svc.clone()).oneshot(weather()));
    tokio::select! {
        _ = &mut leader => panic!("the first call runs until it is cancelled"),
        _ = sleep(Duration::from_millis(10)) => {}
    }
    let mut followers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        followers.spawn(layer.layer(svc.clone()).oneshot(weather()));
    }
    sleep(Duration::from_millis(10)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the followers wait");

    drop(leader);
    while let Some(r) = followers.join_next().await {
        let r = r.expect("task").expect("a follower takes over");
        assert_eq!(n_of(&r), json!(2));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A layer that caches every tool for a minute, namespaced by caller.
fn per_user_layer() -> CacheLayer {
    CacheLayer::new(CacheConfig {
        ttl: Duration::from_secs(60),
        per_user: true,
        ..CacheConfig::default()
    })
    .expect("valid config")
}

#[tokio::test(start_paused = true)]
async fn tool_and_caller_pairs_that_spelled_one_key_do_not_share_an_entry() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let layer = per_user_layer();
    let payload = json!({"account": "me"});
    // Once both were `cache:{a}:b}:c/<digest>`.
    let first = ToolRequest::new("a", payload.clone())
        .kind(CallKind::ReadOnly)
        .caller("b}:c");
    let second = ToolRequest::new("a}:b", payload)
        .kind(CallKind::ReadOnly)
        .caller("c");
    call(&svc, &layer, first.clone()).await.expect("first");
    let other = call(&svc, &layer, second.clone()).await.expect("second");
    assert!(
        !other.provenance.cache_hit,
        "caller `c` of tool `a}}:b` is not served caller `b}}:c`'s entry of tool `a`"
    );
    assert_eq!(n_of(&other), json!(2));
    // Each still hits its own entry.
    for (req, n) in [(first, 1), (second, 2)] {
        let again = call(&svc, &layer, req).await.expect("hit");
        assert!(again.provenance.cache_hit);
        assert_eq!(n_of(&again), json!(n));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn long_callers_and_escaped_tool_names_hit_their_own_entry_and_no_other() {
    // Callers of every length around a few hundred bytes, a character of several bytes
    // at their end, and tool names that are mostly escapes: each key is its own entry.
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let layer = per_user_layer();
    let payload = json!({"q": 1});
    let mut reqs = Vec::new();
    for len in [96, 97, 98, 176, 704] {
        reqs.push(("t".to_owned(), format!("{}é", "c".repeat(len))));
        reqs.push(("t".to_owned(), "c".repeat(len)));
    }
    reqs.push(("{%}".repeat(30), "c".to_owned()));
    reqs.push(("{%}".repeat(30), "cc".to_owned()));
    for (tool, caller) in &reqs {
        let req = ToolRequest::new(tool.as_str(), payload.clone())
            .kind(CallKind::ReadOnly)
            .caller(caller.as_str());
        let first = call(&svc, &layer, req.clone()).await.expect("first");
        assert!(
            !first.provenance.cache_hit,
            "{tool} / {} bytes",
            caller.len()
        );
        let again = call(&svc, &layer, req).await.expect("again");
        assert!(
            again.provenance.cache_hit,
            "{tool} / {} bytes",
            caller.len()
        );
        assert_eq!(n_of(&again), n_of(&first));
    }
    assert_eq!(calls.load(Ordering::SeqCst), reqs.len(), "one call per key");
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_caller_never_hits_a_callers_entry() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let layer = per_user_layer();
    let alice = weather().caller("alice");
    call(&svc, &layer, alice.clone()).await.expect("alice");
    // The same tool and payload, per user or not, without a caller.
    for anonymous in [weather(), weather().extension(PerUser)] {
        let r = call(&svc, &layer, anonymous).await.expect("anonymous");
        assert_ne!(n_of(&r), json!(1), "never alice's entry");
    }
    assert!(
        call(&svc, &layer, alice)
            .await
            .expect("alice")
            .provenance
            .cache_hit
    );
    // A per-user result for a call that names no caller is never cached: it would be
    // served to every other anonymous call.
    let again = call(&svc, &layer, weather()).await.expect("anonymous");
    assert!(!again.provenance.cache_hit, "no shared anonymous entry");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "alice's call and three anonymous calls, none cached"
    );
}

#[test]
fn storage_keys_use_the_core_encoding() {
    let d = toolshield_core::Digest::of_bytes(b"{}");
    assert_eq!(
        toolshield_cache::storage_key("a}:b", Some("c"), &d),
        toolshield_core::keys::storage_key("cache", "a}:b", Some("c"), &d.to_hex())
    );
    assert_eq!(
        toolshield_cache::storage_key("weather", None, &d),
        format!("cache:{{weather}}:-:{d}")
    );
}

/// Fresh hit, stale entry served on a failure, error past the grace: what each call
/// answers and what the counters say, for one store.
async fn fresh_stale_and_expired(store: Arc<dyn toolshield_cache::CacheStore>) -> Vec<String> {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_once_then_refused);
    let cfg = CacheConfig::default()
        .with_ttl(Duration::from_secs(10))
        .with_stale_if_error(Duration::from_secs(60));
    let layer = CacheLayer::with_store(cfg, store).expect("valid config");
    let mut seen = Vec::new();
    for step in [0, 5, 20, 60] {
        advance(Duration::from_secs(step)).await;
        seen.push(match call(&svc, &layer, weather()).await {
            Ok(r) => format!(
                "n={} hit={} stale={}",
                n_of(&r),
                r.provenance.cache_hit,
                r.provenance.stale
            ),
            Err(e) => format!("error {}", e.code()),
        });
    }
    let c = layer.handle().counts();
    seen.push(format!(
        "calls={} hits={} misses={} stale={}",
        calls.load(Ordering::SeqCst),
        c.hits,
        c.misses,
        c.stale
    ));
    seen
}

#[tokio::test(start_paused = true)]
async fn a_store_answering_at_once_and_one_answering_through_a_future_serve_the_same() {
    let at_once =
        fresh_stale_and_expired(Arc::new(toolshield_cache::InMemoryCacheStore::new())).await;
    let through_get = fresh_stale_and_expired(Arc::new(TestStore::new(Answers::ThroughGet))).await;
    assert_eq!(at_once, through_get);
    assert_eq!(
        at_once,
        [
            "n=1 hit=false stale=false",
            "n=1 hit=true stale=false",
            "n=1 hit=true stale=true",
            "error CONNECTION_FAILED",
            "calls=3 hits=1 misses=3 stale=1",
        ]
    );
}

/// What a [`TestStore`] answers without I/O.
#[derive(Clone, Copy)]
enum Answers {
    /// Nothing: every look goes through `get`, as a store with I/O answers.
    ThroughGet,
    /// What the in-memory store holds (`lookup_now`), a miss being left to `get`.
    FoundAtOnce,
    /// Every key at once (`answers_now`), a miss included.
    EveryKeyAtOnce,
}

/// The in-memory store, counting the looks made through `get`, answering without I/O
/// as told.
struct TestStore {
    inner: toolshield_cache::InMemoryCacheStore,
    gets: Arc<AtomicUsize>,
    answers: Answers,
}

impl TestStore {
    fn new(answers: Answers) -> Self {
        TestStore {
            inner: toolshield_cache::InMemoryCacheStore::new(),
            gets: Arc::new(AtomicUsize::new(0)),
            answers,
        }
    }
}

impl toolshield_cache::CacheStore for TestStore {
    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> toolshield_cache::StoreFuture<'a, Option<toolshield_cache::CacheLookup>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(key)
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        response: ToolResponse,
        ttl: Duration,
    ) -> toolshield_cache::StoreFuture<'a, ()> {
        self.inner.put(key, response, ttl)
    }

    fn remove<'a>(&'a self, key: &'a str) -> toolshield_cache::StoreFuture<'a, bool> {
        self.inner.remove(key)
    }

    fn lookup_now(&self, key: &str) -> Option<toolshield_cache::CacheLookup> {
        match self.answers {
            Answers::ThroughGet => None,
            Answers::FoundAtOnce | Answers::EveryKeyAtOnce => self.inner.lookup_now(key),
        }
    }

    fn answers_now(&self) -> bool {
        matches!(self.answers, Answers::EveryKeyAtOnce)
    }
}

/// A layer with a 60 s TTL over a fresh [`TestStore`] answering as told.
fn over_test_store(answers: Answers) -> (Arc<TestStore>, CacheLayer) {
    let store = Arc::new(TestStore::new(answers));
    let layer = CacheLayer::with_store(
        CacheConfig::default().with_ttl(Duration::from_secs(60)),
        Arc::clone(&store) as Arc<dyn toolshield_cache::CacheStore>,
    )
    .expect("valid config");
    (store, layer)
}

/// Stores `{"n": "stored"}` as `weather()`'s entry in `store`, as another caller would.
async fn store_weather(store: &dyn toolshield_cache::CacheStore) {
    let key = toolshield_cache::storage_key(
        "weather",
        None,
        &weather().payload_digest().expect("digest"),
    );
    store
        .put(
            &key,
            ToolResponse::new(json!({"n": "stored"})),
            Duration::from_secs(60),
        )
        .await
        .expect("put");
}

/// A miss, a fresh hit, a stale entry served on a failure and an error past the grace,
/// through a store whose `lookup_now` answers (or not) for every key: the answers, and
/// how many times the layer asked `get`.
async fn looks_through_get(answers: Answers) -> (Vec<String>, usize) {
    let store = TestStore::new(answers);
    let gets = Arc::clone(&store.gets);
    let seen = fresh_stale_and_expired(Arc::new(store)).await;
    (seen, gets.load(Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn a_store_that_answers_every_key_at_once_is_not_asked_again_on_a_miss() {
    let (at_once, gets_at_once) = looks_through_get(Answers::EveryKeyAtOnce).await;
    let (partial, gets_partial) = looks_through_get(Answers::FoundAtOnce).await;
    // The same answers either way.
    assert_eq!(at_once, partial);
    assert_eq!(at_once[4], "calls=3 hits=1 misses=3 stale=1");
    // Steps: a miss (tool runs), a fresh hit (answered in `call`), a stale entry found at
    // once (tool fails, the entry is served), an expired entry (a miss again). A store
    // that answers every key is never asked through `get`; one that does not is asked
    // on each of the two misses (a stale entry it found at once is its answer).
    assert_eq!(
        gets_at_once, 0,
        "no second look when lookup_now answers every key"
    );
    assert_eq!(
        gets_partial, 2,
        "a miss from lookup_now alone is looked up through get"
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_dropped_leader_a_follower_looks_the_key_up_again() {
    // The first look was answered at once (a miss); the follower whose leader went away
    // must look again through the store, not reuse that first answer, and finds the
    // entry another caller stored meanwhile.
    let (store, layer) = over_test_store(Answers::EveryKeyAtOnce);
    let gets = Arc::clone(&store.gets);
    let calls = Arc::new(AtomicUsize::new(0));
    let slow = counting_tool(&calls, Duration::from_secs(10), ok_n);
    let mut leader = Box::pin(layer.layer(slow.clone()).oneshot(weather()));
    tokio::select! {
        _ = &mut leader => panic!("the first call runs until it is dropped"),
        _ = sleep(Duration::from_millis(10)) => {}
    }
    let follower = tokio::spawn(layer.layer(slow.clone()).oneshot(weather()));
    sleep(Duration::from_millis(10)).await;
    assert_eq!(
        gets.load(Ordering::SeqCst),
        0,
        "both first looks were answered at once"
    );
    // Someone else stores the entry, then the leader goes away.
    store_weather(&*store).await;
    drop(leader);
    let got = follower.await.expect("join").expect("an answer");
    assert_eq!(
        n_of(&got),
        json!("stored"),
        "the follower found the stored entry"
    );
    assert!(got.provenance.cache_hit);
    assert_eq!(
        gets.load(Ordering::SeqCst),
        1,
        "the follower looked again through get"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "only the dropped leader ran the tool"
    );
}

#[tokio::test(start_paused = true)]
async fn an_entry_stored_between_call_and_the_first_poll_is_found() {
    // A store that does not answer every key at once (`call` found nothing there, which
    // is not yet a miss): the full path looks again when first polled and answers the
    // entry stored meanwhile; the tool never runs.
    let (store, layer) = over_test_store(Answers::FoundAtOnce);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = layer.layer(counting_tool(&calls, Duration::ZERO, ok_n));
    let pending = tower::Service::call(svc.ready().await.expect("ready"), weather());
    store_weather(&*store).await;
    let got = pending.await.expect("an answer");
    assert_eq!(n_of(&got), json!("stored"));
    assert!(got.provenance.cache_hit);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the tool did not run");
}

#[tokio::test(start_paused = true)]
async fn a_miss_leads_its_flight_from_call_and_a_later_caller_follows_it() {
    // A store that answers every key at once: a miss is decided in `call`, which joins
    // the key's flight there and calls the tool with the service it was given. A second
    // caller that comes before the first future is even polled follows that flight: the
    // tool runs once, both get its answer, the second as coalesced.
    let (store, layer) = over_test_store(Answers::EveryKeyAtOnce);
    let handle = layer.handle();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = layer.layer(counting_tool(&calls, Duration::from_secs(1), ok_n));
    let first = tower::Service::call(svc.ready().await.expect("ready"), weather());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the leader called the tool in call"
    );
    let second = tokio::spawn(svc.clone().oneshot(weather()));
    tokio::task::yield_now().await;
    let (a, b) = tokio::join!(first, second);
    let (a, b) = (a.expect("leader"), b.expect("join").expect("follower"));
    assert_eq!(n_of(&a), json!(1));
    assert_eq!(n_of(&b), json!(1), "the follower got the leader's answer");
    assert!(!a.provenance.cache_hit && b.provenance.cache_hit);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the tool ran once");
    let counts = handle.counts();
    assert_eq!((counts.misses, counts.coalesced), (1, 1));
    assert_eq!(store.gets.load(Ordering::SeqCst), 0, "no look through get");
}

#[tokio::test(start_paused = true)]
async fn a_miss_led_from_call_and_dropped_unpolled_leaves_no_flight_behind() {
    // The leader's future is dropped before its first poll: its flight ends with no
    // result, and the next caller leads (and runs the tool) instead of waiting forever.
    let (_, layer) = over_test_store(Answers::EveryKeyAtOnce);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = layer.layer(counting_tool(&calls, Duration::ZERO, ok_n));
    let dropped = tower::Service::call(svc.ready().await.expect("ready"), weather());
    drop(dropped);
    let got = tokio::time::timeout(Duration::from_secs(5), svc.clone().oneshot(weather()))
        .await
        .expect("the next caller does not wait for a dropped leader")
        .expect("an answer");
    assert_eq!(n_of(&got), json!(2), "the next caller ran the tool itself");
    assert!(!got.provenance.cache_hit);
}

/// A fallback tier's answer (degraded, from another source) is handed to the caller but
/// never cached: once the primary recovers, the next call reaches it instead of being
/// served the degraded answer for the whole TTL.
#[tokio::test(start_paused = true)]
async fn a_fallback_tiers_answer_is_not_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, |n| {
        let mut resp = ToolResponse::new(json!({ "n": n }));
        if n == 1 {
            resp.provenance.tier = Some(Arc::from("backup"));
        }
        Ok(resp)
    });
    let (layer, handle) = layer(Duration::from_secs(600), Duration::from_secs(600));

    let degraded = call(&svc, &layer, weather()).await.expect("tier answer");
    assert_eq!(degraded.provenance.tier.as_deref(), Some("backup"));
    assert!(!degraded.provenance.cache_hit);

    let next = call(&svc, &layer, weather()).await.expect("primary");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the tier's answer was not cached"
    );
    assert_eq!(n_of(&next), json!(2));
    assert!(!next.provenance.cache_hit);
    assert_eq!(next.provenance.tier, None);

    // The primary's answer is cached as usual.
    let hit = call(&svc, &layer, weather()).await.expect("hit");
    assert!(hit.provenance.cache_hit);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    drop(handle);
}

#[tokio::test(start_paused = true)]
async fn a_blank_caller_is_no_caller_and_shares_no_per_user_entry() {
    // An application that writes an empty (or blank) caller id for its anonymous users
    // names no caller: their per-user results would otherwise be one entry served to
    // every one of them.
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = counting_tool(&calls, Duration::ZERO, ok_n);
    let layer = per_user_layer();
    for blank in ["", " ", "\t \n"] {
        let first = call(&svc, &layer, weather().caller(blank))
            .await
            .expect("first");
        let again = call(&svc, &layer, weather().caller(blank))
            .await
            .expect("again");
        assert!(
            !first.provenance.cache_hit && !again.provenance.cache_hit,
            "caller {blank:?}: a per-user result is not cached for a blank caller"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 6, "every call ran the tool");
}
