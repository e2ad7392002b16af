//! Rate limiter behaviour with a paused clock: burst then steady rate, the exact
//! retry-after, waiting within `max_wait` and the deadline, per-key buckets and their
//! bound, a cancelled waiter giving its turn back, store failures.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_contract::ShieldRequest;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{
    key_fn, ByCaller, Decision, MemoryRateLimitStore, OnStoreError, RateLimit, RateLimitConfig,
    RateLimitLayer, RateLimitStore, Turn,
};
use toolshield_store::{StoreError, StoreFuture};
use toolshield_test::Rng;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// A tool that records when each call started (by its `n`).
fn recording(starts: Arc<Mutex<Vec<(u64, Instant)>>>) -> Svc {
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let starts = Arc::clone(&starts);
        async move {
            let n = req.payload().get("n").and_then(|v| v.as_u64()).unwrap_or(0);
            starts.lock().unwrap().push((n, Instant::now()));
            Ok::<_, ToolError>(ToolResponse::new(json!(n)))
        }
    }))
}

fn tool() -> Svc {
    recording(Arc::new(Mutex::new(Vec::new())))
}

fn req() -> ToolRequest {
    ToolRequest::new("search", json!({}))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_then_the_steady_rate_with_the_exact_retry_after() {
    let layer = RateLimitLayer::new(RateLimit::new(10, Duration::from_secs(1), 3));
    let stats = layer.stats();
    let svc = layer.layer(tool());
    for _ in 0..3 {
        assert!(svc.clone().oneshot(req()).await.is_ok());
    }
    let err = svc.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(ms(100)));
    assert!(err.message().contains("`search`"), "{}", err.message());
    tokio::time::advance(ms(30)).await;
    assert_eq!(
        svc.clone().oneshot(req()).await.unwrap_err().retry_after(),
        Some(ms(70))
    );
    tokio::time::advance(ms(70)).await;
    // Steady: one call per 100 ms.
    for _ in 0..5 {
        assert!(svc.clone().oneshot(req()).await.is_ok());
        assert_eq!(
            svc.clone().oneshot(req()).await.unwrap_err().retry_after(),
            Some(ms(100))
        );
        tokio::time::advance(ms(100)).await;
    }
    // Idle for the whole burst: the burst is back, and no more.
    tokio::time::advance(ms(300)).await;
    for _ in 0..3 {
        assert!(svc.clone().oneshot(req()).await.is_ok());
    }
    assert!(svc.clone().oneshot(req()).await.is_err());
    let s = stats.snapshot();
    assert_eq!(
        (s.admitted, s.rejected, s.waited),
        (3 + 5 + 3, 2 + 5 + 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn wait_mode_waits_its_turn_within_max_wait_and_rejects_beyond() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .wait_up_to(Duration::from_secs(2));
    let stats = layer.stats();
    let svc = layer.layer(recording(Arc::clone(&starts)));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..3u64 {
        tasks.push(tokio::spawn(
            svc.clone()
                .oneshot(ToolRequest::new("search", json!({"n": n}))),
        ));
    }
    settle().await;
    // The fourth would wait 3 s: rejected at once with that wait.
    let err = svc.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(t0.elapsed(), Duration::ZERO);
    for t in tasks {
        assert!(t.await.unwrap().is_ok());
    }
    let mut got: Vec<_> = starts
        .lock()
        .unwrap()
        .iter()
        .map(|(n, t)| (*n, *t - t0))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (0, Duration::ZERO),
            (1, Duration::from_secs(1)),
            (2, Duration::from_secs(2))
        ]
    );
    let s = stats.snapshot();
    assert_eq!((s.admitted, s.waited, s.rejected), (3, 2, 1));
}

#[tokio::test(start_paused = true)]
async fn wait_mode_never_waits_past_the_call_deadline() {
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .wait_up_to(Duration::from_secs(10))
        .layer(tool());
    assert!(svc.clone().oneshot(req()).await.is_ok());
    let mut short = req();
    if let Some(s) = short.call_state_mut() {
        s.set_deadline(Instant::now() + ms(500));
    }
    let t0 = Instant::now();
    let err = svc.clone().oneshot(short).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(t0.elapsed(), Duration::ZERO);
    // A deadline with room for the wait: it waits.
    let mut long = req();
    if let Some(s) = long.call_state_mut() {
        s.set_deadline(Instant::now() + ms(1500));
    }
    assert!(svc.oneshot(long).await.is_ok());
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_cancelled_gives_its_turn_back() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .wait_up_to(Duration::from_secs(5));
    let stats = layer.stats();
    let svc = layer.layer(recording(Arc::clone(&starts)));
    let t0 = Instant::now();
    assert!(svc.clone().oneshot(req()).await.is_ok());
    let waiter = tokio::spawn(
        svc.clone()
            .oneshot(ToolRequest::new("search", json!({"n": 1}))),
    );
    settle().await;
    tokio::time::advance(ms(400)).await;
    waiter.abort();
    settle().await;
    // Without the refund this call would wait until 2 s.
    assert!(svc
        .clone()
        .oneshot(ToolRequest::new("search", json!({"n": 2})))
        .await
        .is_ok());
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    let ran: Vec<u64> = starts.lock().unwrap().iter().map(|(n, _)| *n).collect();
    assert_eq!(ran, vec![0, 2]);
    assert_eq!(stats.snapshot().waited, 2);
}

/// A waiter cancelled in the middle of the queue keeps its turn taken: giving it back
/// would move the key's time while the calls behind it keep theirs, and a newcomer would
/// then start together with the last of them (two calls in one interval, over the rate).
#[tokio::test(start_paused = true)]
async fn a_waiter_cancelled_mid_queue_never_lets_two_calls_share_a_turn() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .wait_up_to(Duration::from_secs(10));
    let svc = layer.layer(recording(Arc::clone(&starts)));
    let call = |n: u64| {
        svc.clone()
            .oneshot(ToolRequest::new("search", json!({"n": n})))
    };
    let t0 = Instant::now();
    assert!(call(0).await.is_ok()); // at 0 s
    let second = tokio::spawn(call(1)); // its turn: 1 s
    settle().await;
    let third = tokio::spawn(call(2)); // its turn: 2 s
    settle().await;
    tokio::time::advance(ms(100)).await;
    second.abort();
    settle().await;
    let fourth = tokio::spawn(call(3)); // must not share 2 s with the third
    settle().await;
    assert!(third.await.unwrap().is_ok());
    assert!(fourth.await.unwrap().is_ok());
    let at: Vec<(u64, Duration)> = starts
        .lock()
        .unwrap()
        .iter()
        .map(|(n, t)| (*n, *t - t0))
        .collect();
    assert_eq!(
        at,
        vec![
            (0, Duration::ZERO),
            (2, Duration::from_secs(2)),
            (3, Duration::from_secs(3))
        ]
    );
    for pair in at.windows(2) {
        assert!(pair[1].1 - pair[0].1 >= Duration::from_secs(1), "{at:?}");
    }
}

/// The store's own rule: only the last turn reserved is taken back.
#[tokio::test(start_paused = true)]
async fn the_memory_store_takes_back_only_the_last_turn() {
    let store = MemoryRateLimitStore::default();
    let limit = RateLimit::new(1, Duration::from_secs(1), 1);
    let wait = Duration::from_secs(10);
    let turn = |d: Decision| match d {
        Decision::Admit { turn, .. } => turn,
        Decision::Reject { .. } => panic!("rejected: {d:?}"),
    };
    let _first = turn(store.acquire(Some("k"), &limit, wait).await.unwrap());
    let second = turn(store.acquire(Some("k"), &limit, wait).await.unwrap());
    let third = turn(store.acquire(Some("k"), &limit, wait).await.unwrap());
    // The second is not the last: nothing moves, the next turn is at 3 s.
    store.refund(Some("k"), &limit, second);
    let d = store
        .acquire(Some("k"), &limit, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        d,
        Decision::Reject {
            retry_after: Duration::from_secs(3)
        }
    );
    // The third is the last: given back, the next turn is at 2 s.
    store.refund(Some("k"), &limit, third);
    let d = store
        .acquire(Some("k"), &limit, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        d,
        Decision::Reject {
            retry_after: Duration::from_secs(2)
        }
    );
    // A second refund of the same turn does nothing.
    store.refund(Some("k"), &limit, third);
    let d = store
        .acquire(Some("k"), &limit, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        d,
        Decision::Reject {
            retry_after: Duration::from_secs(2)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn each_caller_has_its_own_bucket_and_anonymous_calls_share_one() {
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(60), 1))
        .keyed(ByCaller)
        .layer(tool());
    assert!(svc.clone().oneshot(req().caller("alice")).await.is_ok());
    assert!(svc.clone().oneshot(req().caller("alice")).await.is_err());
    assert!(svc.clone().oneshot(req().caller("bob")).await.is_ok());
    // An empty caller id is a caller of its own, not the anonymous bucket.
    assert!(svc.clone().oneshot(req().caller("")).await.is_ok());
    assert!(svc.clone().oneshot(req()).await.is_ok());
    assert!(svc.clone().oneshot(req()).await.is_err());
    assert!(svc.clone().oneshot(req().caller("bob")).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_hostile_keys_stay_within_the_key_bound() {
    let store = Arc::new(MemoryRateLimitStore::new(100));
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(3600), 1))
        .with_store(store.clone())
        .keyed(ByCaller)
        .layer(tool());
    for i in 0..10_000 {
        let r = req().caller(format!("attacker-{i}"));
        assert!(svc.clone().oneshot(r).await.is_ok());
        assert!(store.len() <= 100, "{} keys held", store.len());
    }
    // A key far too long to store is still limited (in the overflow bucket).
    let long = "x".repeat(1 << 20);
    assert!(svc
        .clone()
        .oneshot(req().caller(long.clone()))
        .await
        .is_ok());
    assert!(svc.clone().oneshot(req().caller(long)).await.is_err());
    assert!(store.len() <= 100);
}

/// A store that fails every operation.
struct Down;

impl RateLimitStore for Down {
    fn acquire<'a>(
        &'a self,
        _key: Option<&'a str>,
        _limit: &'a RateLimit,
        _max_wait: Duration,
    ) -> StoreFuture<'a, Decision> {
        Box::pin(async { Err(StoreError::new("connection refused")) })
    }

    fn refund(&self, _key: Option<&str>, _limit: &RateLimit, _turn: Turn) {}
}

#[tokio::test(start_paused = true)]
async fn a_failed_store_fails_open_or_closed_as_configured() {
    let limit = RateLimit::new(1, Duration::from_secs(60), 1);
    let open = RateLimitLayer::new(limit).with_store(Arc::new(Down));
    let open_stats = open.stats();
    let svc = open.layer(tool());
    for _ in 0..3 {
        assert!(svc.clone().oneshot(req()).await.is_ok());
    }
    let s = open_stats.snapshot();
    assert_eq!((s.store_errors, s.admitted), (3, 3));

    let closed = RateLimitLayer::new(limit)
        .with_store(Arc::new(Down))
        .on_store_error(OnStoreError::Reject);
    let closed_stats = closed.stats();
    let err = closed.layer(tool()).oneshot(req()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreUnavailable);
    assert_eq!(closed_stats.snapshot().store_errors, 1);
}

/// The memory store behind the remote path (no `acquire_now`).
struct Remote(MemoryRateLimitStore);

impl RateLimitStore for Remote {
    fn acquire<'a>(
        &'a self,
        key: Option<&'a str>,
        limit: &'a RateLimit,
        max_wait: Duration,
    ) -> StoreFuture<'a, Decision> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            self.0.acquire(key, limit, max_wait).await
        })
    }

    fn refund(&self, key: Option<&str>, limit: &RateLimit, turn: Turn) {
        self.0.refund(key, limit, turn);
    }
}

#[tokio::test(start_paused = true)]
async fn a_remote_store_gives_the_same_decisions() {
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .with_store(Arc::new(Remote(MemoryRateLimitStore::default())))
        .wait_up_to(Duration::from_secs(1))
        .layer(tool());
    let t0 = Instant::now();
    assert!(svc.clone().oneshot(req()).await.is_ok());
    assert!(svc.clone().oneshot(req()).await.is_ok());
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    let a = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    let err = svc.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
    assert!(a.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_key_function_picks_the_bucket() {
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(60), 1))
        .keyed(key_fn(|r: &ToolRequest| {
            r.payload()
                .get("tenant")
                .and_then(|t| t.as_str())
                .map(Cow::Borrowed)
        }))
        .layer(tool());
    let t = |name: &str| ToolRequest::new("search", json!({"tenant": name}));
    assert!(svc.clone().oneshot(t("a")).await.is_ok());
    assert!(svc.clone().oneshot(t("a")).await.is_err());
    assert!(svc.clone().oneshot(t("b")).await.is_ok());
}

#[test]
fn config_lists_every_problem() {
    let cfg: RateLimitConfig = serde_json::from_str(
        r#"{"rate": 0, "period": "0s", "burst": 0, "on_limit": "wait", "max_wait": "0s", "max_keys": 0}"#,
    )
    .unwrap();
    let err = cfg.validate().unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["rate", "period", "burst", "max_wait", "max_keys"]);
    assert!(RateLimitLayer::from_config(&cfg).is_err());
    let fast = RateLimitConfig {
        rate: 2_000_000,
        ..RateLimitConfig::default()
    };
    let err = fast.validate().unwrap_err();
    assert_eq!(err.problems()[0].field, "rate");
    assert!(serde_json::from_str::<RateLimitConfig>(r#"{"rat": 1}"#).is_err());
    assert!(RateLimitConfig::default().validate().is_ok());
}

#[tokio::test(start_paused = true)]
async fn from_config_keys_on_the_caller_and_waits() {
    let cfg: RateLimitConfig = serde_json::from_str(
        r#"{"rate": 2, "period": "1s", "burst": 1, "key": "caller", "on_limit": "wait", "max_wait": "600ms"}"#,
    )
    .unwrap();
    let svc = RateLimitLayer::from_config(&cfg).unwrap().layer(tool());
    let t0 = Instant::now();
    assert!(svc.clone().oneshot(req().caller("a")).await.is_ok());
    assert!(svc.clone().oneshot(req().caller("b")).await.is_ok());
    assert!(svc.clone().oneshot(req().caller("a")).await.is_ok());
    assert_eq!(t0.elapsed(), ms(500));
}

/// A remote store whose answer takes `latency` to come back (the decision is made at
/// once, on the store's side, as Redis makes it when the script runs).
struct Slow {
    store: MemoryRateLimitStore,
    latency: Duration,
}

impl RateLimitStore for Slow {
    fn acquire<'a>(
        &'a self,
        key: Option<&'a str>,
        limit: &'a RateLimit,
        max_wait: Duration,
    ) -> StoreFuture<'a, Decision> {
        Box::pin(async move {
            let d = self.store.acquire(key, limit, max_wait).await;
            tokio::time::sleep(self.latency).await;
            d
        })
    }

    fn refund(&self, key: Option<&str>, limit: &RateLimit, turn: Turn) {
        self.store.refund(key, limit, turn);
    }
}

/// With a remote store, the time the answer took to come back is part of the wait: a
/// call whose turn comes only after its deadline is rejected with `RATE_LIMITED` and a
/// retry-after (its turn given back), never started past its deadline.
#[tokio::test(start_paused = true)]
async fn a_remote_wait_never_starts_a_call_past_its_deadline() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .with_store(Arc::new(Slow {
            store: MemoryRateLimitStore::default(),
            latency: ms(300),
        }))
        .wait_up_to(Duration::from_secs(10));
    let stats = layer.stats();
    let svc = layer.layer(recording(Arc::clone(&starts)));
    let t0 = Instant::now();
    // Decided at 0 s (the key's next turn is at 1 s), answered at 0.3 s.
    assert!(svc.clone().oneshot(req()).await.is_ok());
    assert_eq!(t0.elapsed(), ms(300));
    // At 0.3 s with a deadline at 1.1 s: the store sees a 0.7 s wait that fits, but its
    // answer arrives at 0.6 s, when only 0.5 s are left.
    let deadline = Instant::now() + ms(800);
    let mut late = ToolRequest::new("search", json!({"n": 1}));
    if let Some(s) = late.call_state_mut() {
        s.set_deadline(deadline);
    }
    match svc.clone().oneshot(late).await {
        Ok(_) => {
            let started = starts.lock().unwrap().last().map(|(_, t)| *t).unwrap();
            assert!(
                started < deadline,
                "started {:?} after the deadline {:?}",
                started - t0,
                deadline - t0
            );
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::RateLimited, "{e}");
            let after = e.retry_after().expect("a retry_after");
            assert!(!after.is_zero() && after <= ms(700), "{after:?}");
            assert_eq!(t0.elapsed(), ms(600), "rejected when the answer came");
        }
    }
    // The turn was given back: the next call (no deadline), decided at 0.6 s, has its
    // turn at 1 s (not 2 s) and starts when the 0.4 s wait has run after the answer.
    assert!(svc
        .clone()
        .oneshot(ToolRequest::new("search", json!({"n": 2})))
        .await
        .is_ok());
    let at: Vec<(u64, Duration)> = starts
        .lock()
        .unwrap()
        .iter()
        .map(|(n, t)| (*n, *t - t0))
        .collect();
    assert_eq!(at, vec![(0, ms(300)), (2, ms(1300))]);
    assert_eq!(stats.snapshot().rejected, 1);
}

/// A waiter whose caller cancels (its token, the future still polled) stops waiting at
/// once with `CANCELLED`: the tool is never called with a cancelled token, and its turn
/// goes back to the next caller.
#[tokio::test(start_paused = true)]
async fn a_waiter_whose_token_is_cancelled_stops_at_once_and_gives_its_turn_back() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .wait_up_to(Duration::from_secs(5));
    let svc = layer.layer(recording(Arc::clone(&starts)));
    let t0 = Instant::now();
    assert!(svc.clone().oneshot(req()).await.is_ok());
    let waiting = ToolRequest::new("search", json!({"n": 1}));
    let token = waiting.call_token().clone();
    let waiter = tokio::spawn(svc.clone().oneshot(waiting));
    settle().await;
    tokio::time::advance(ms(400)).await;
    token.cancel();
    settle().await;
    assert!(
        waiter.is_finished(),
        "the waiter still sleeps after its caller cancelled"
    );
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(t0.elapsed(), ms(400));
    // Its turn went back: this call starts at 1 s, not 2 s.
    assert!(svc
        .clone()
        .oneshot(ToolRequest::new("search", json!({"n": 2})))
        .await
        .is_ok());
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    let ran: Vec<u64> = starts.lock().unwrap().iter().map(|(n, _)| *n).collect();
    assert_eq!(ran, vec![0, 2], "the cancelled call reached the tool");
}

/// Random waiting calls, cancelled by their token or dropped at random, with time
/// passing: the calls that reach the tool never exceed the rate (any `k` starts span at
/// least `(k - burst) * interval`), no call reaches it after it was cancelled, and every
/// outcome is a success, `RATE_LIMITED` or `CANCELLED`.
#[tokio::test(start_paused = true)]
async fn random_waiters_cancelled_or_dropped_never_exceed_the_rate() {
    let interval = ms(100);
    let burst = 2u64;
    for seed in 0..100u64 {
        let mut rng = Rng::new(seed);
        let starts = Arc::new(Mutex::new(Vec::new()));
        let layer =
            RateLimitLayer::new(RateLimit::new(10, Duration::from_secs(1), 2)).wait_up_to(ms(500));
        let svc = layer.layer(recording(Arc::clone(&starts)));
        let mut running = Vec::new();
        let mut cancelled = std::collections::HashMap::new();
        for n in 1..=40u64 {
            match rng.below(5) {
                0 | 1 => {
                    let r = ToolRequest::new("search", json!({ "n": n }));
                    let token = r.call_token().clone();
                    running.push((n, token, tokio::spawn(svc.clone().oneshot(r))));
                }
                2 if !running.is_empty() => {
                    let i = rng.below(running.len() as u64) as usize;
                    let (n, token, task) = &running[i];
                    if rng.below(2) == 0 {
                        token.cancel();
                    } else {
                        task.abort();
                    }
                    cancelled.entry(*n).or_insert_with(Instant::now);
                }
                // A sleep, not `advance`: the paused clock moves from timer to timer, so
                // every waiter starts at its own time.
                3 => tokio::time::sleep(ms(1 + rng.below(120))).await,
                _ => settle().await,
            }
            settle().await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        for (n, _, task) in running {
            match task.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => assert!(
                    matches!(e.kind(), ErrorKind::RateLimited | ErrorKind::Cancelled),
                    "seed {seed}: call {n}: {e}"
                ),
                Err(e) => assert!(e.is_cancelled(), "seed {seed}: call {n}"),
            }
        }
        let mut times: Vec<(u64, Instant)> = starts.lock().unwrap().clone();
        for (n, started) in &times {
            assert!(
                cancelled.get(n).is_none_or(|at| started <= at),
                "seed {seed}: call {n} ran after its caller cancelled it"
            );
        }
        times.sort_by_key(|(_, t)| *t);
        for i in 0..times.len() {
            for j in i..times.len() {
                let k = (j - i + 1) as u64;
                let span = times[j].1 - times[i].1;
                let least = interval * u32::try_from(k.saturating_sub(burst)).unwrap();
                assert!(
                    span >= least,
                    "seed {seed}: {k} starts within {span:?}, at least {least:?} allowed"
                );
            }
        }
    }
}
