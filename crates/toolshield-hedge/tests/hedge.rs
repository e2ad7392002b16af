//! Behaviour of the hedging layer, on tokio's paused clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use tokio::time::{advance, Instant};
use tokio_util::sync::CancellationToken;
use toolshield_contract::{
    CallKind, ErrorKind, Hedged, InBandFailure, ShieldRequest, ShieldResponse, ToolError,
};
use toolshield_core::ToolRequest;
use toolshield_hedge::{HedgeConfig, HedgeDelay, HedgeLayer};
use toolshield_retry::RetryBudget;
use tower::{Layer, Service, ServiceExt};

/// A response that keeps the hedge mark and may carry an in-band failure.
#[derive(Debug, Clone, PartialEq)]
struct Resp {
    body: &'static str,
    hedged: Option<Hedged>,
    in_band: Option<ErrorKind>,
}

impl ShieldResponse for Resp {
    fn in_band_failure(&self) -> Option<InBandFailure> {
        self.in_band.map(|kind| InBandFailure {
            kind,
            retry_after: None,
        })
    }
    fn mark_hedged(&mut self, hedged: Hedged) {
        self.hedged = Some(hedged);
    }
}

/// What one attempt does: answer after `after` with `out`.
#[derive(Clone, Copy)]
struct Step {
    after: Duration,
    out: Result<&'static str, ErrorKind>,
    in_band: Option<ErrorKind>,
}

fn ok(ms: u64, body: &'static str) -> Step {
    Step {
        after: Duration::from_millis(ms),
        out: Ok(body),
        in_band: None,
    }
}

fn err(ms: u64, kind: ErrorKind) -> Step {
    Step {
        after: Duration::from_millis(ms),
        out: Err(kind),
        in_band: None,
    }
}

/// One attempt as the tool saw it.
struct Seen {
    attempt: CancellationToken,
    call: CancellationToken,
    dropped: Arc<AtomicBool>,
    completed: Arc<AtomicBool>,
}

impl Seen {
    fn abandoned(&self) -> bool {
        self.dropped.load(Ordering::SeqCst) && !self.completed.load(Ordering::SeqCst)
    }
}

/// A tool that plays one step per call (the last step repeats), watches its attempt
/// token (cancelled: `CANCELLED`), and records every attempt.
#[derive(Clone)]
struct Tool {
    plan: Arc<Vec<Step>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    calls: Arc<AtomicUsize>,
}

impl Tool {
    fn new(plan: Vec<Step>) -> Self {
        Tool {
            plan: Arc::new(plan),
            seen: Arc::default(),
            calls: Arc::default(),
        }
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn attempt_cancelled(&self, i: usize) -> bool {
        self.seen.lock().unwrap()[i].attempt.is_cancelled()
    }
    fn abandoned(&self, i: usize) -> bool {
        self.seen.lock().unwrap()[i].abandoned()
    }
}

struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Service<ToolRequest> for Tool {
    type Response = Resp;
    type Error = ToolError;
    type Future = Pin<Box<dyn Future<Output = Result<Resp, ToolError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let step = self.plan[n.min(self.plan.len() - 1)];
        let state = req.call_state().expect("ToolRequest carries a state");
        let attempt = state.tokens().attempt().clone();
        let dropped = Arc::new(AtomicBool::new(false));
        let completed = Arc::new(AtomicBool::new(false));
        self.seen.lock().unwrap().push(Seen {
            attempt: attempt.clone(),
            call: state.tokens().call().clone(),
            dropped: dropped.clone(),
            completed: completed.clone(),
        });
        Box::pin(async move {
            let _flag = DropFlag(dropped);
            tokio::select! {
                () = tokio::time::sleep(step.after) => {}
                () = attempt.cancelled() => return Err(ToolError::cancelled("attempt cancelled")),
            }
            completed.store(true, Ordering::SeqCst);
            match step.out {
                Ok(body) => Ok(Resp {
                    body,
                    hedged: None,
                    in_band: step.in_band,
                }),
                Err(kind) => Err(ToolError::new(kind, "scripted failure")),
            }
        })
    }
}

/// Lets spawned tasks run up to their next wait.
async fn settle() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

fn read(tool: &str) -> ToolRequest {
    ToolRequest::new(tool.to_owned(), json!({"q": 1})).kind(CallKind::ReadOnly)
}

fn fixed(ms: u64, max_hedges: u32) -> HedgeLayer {
    HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(ms)), max_hedges)
}

#[tokio::test(start_paused = true)]
async fn slow_first_attempt_loses_to_a_fast_hedge_and_is_cancelled() {
    let tool = Tool::new(vec![ok(10_000, "first"), ok(10, "hedge")]);
    let layer = fixed(100, 1);
    let start = Instant::now();
    let res = layer
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap();
    assert_eq!(res.body, "hedge");
    assert_eq!(start.elapsed(), Duration::from_millis(110));
    assert_eq!(
        res.hedged,
        Some(Hedged {
            answered_by: 2,
            sent: 2
        })
    );
    assert_eq!(tool.calls(), 2);
    assert!(
        tool.attempt_cancelled(0),
        "the loser's attempt token is cancelled"
    );
    assert!(
        tool.abandoned(0),
        "the loser's future is dropped unfinished"
    );
    assert!(
        !tool.attempt_cancelled(1),
        "the winner's token is left alone"
    );
    let seen = tool.seen.lock().unwrap();
    assert!(
        !seen[0].attempt.is_cancelled() || !seen[1].attempt.is_cancelled(),
        "each attempt has its own token"
    );
    assert!(
        !seen[1].call.is_cancelled(),
        "the call itself is not cancelled"
    );
    drop(seen);
    assert_eq!(layer.stats().hedges_sent(), 1);
    assert_eq!(layer.stats().hedge_wins(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_faster_than_the_delay_sends_no_hedge() {
    let tool = Tool::new(vec![ok(50, "first"), ok(1, "hedge")]);
    let layer = fixed(100, 3);
    let res = layer
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap();
    assert_eq!(res.body, "first");
    assert_eq!(res.hedged, None, "one attempt: no mark");
    advance(Duration::from_secs(5)).await;
    assert_eq!(tool.calls(), 1);
    assert_eq!(layer.stats().hedges_sent(), 0);
    assert_eq!(
        layer.stats().eligible(),
        1,
        "a read-only call could be hedged"
    );
    assert!(!tool.attempt_cancelled(0));
}

#[tokio::test(start_paused = true)]
async fn mutating_and_unkeyed_idempotent_calls_are_never_hedged() {
    let cases = [
        ToolRequest::new("pay", json!({})).kind(CallKind::Mutating),
        ToolRequest::new("pay", json!({}))
            .kind(CallKind::Mutating)
            .idempotency_key("k1"),
        ToolRequest::new("put", json!({})).kind(CallKind::Idempotent),
        // A blank key is no key, as the idempotency layer and retry read it.
        ToolRequest::new("put", json!({}))
            .kind(CallKind::Idempotent)
            .idempotency_key(""),
        ToolRequest::new("put", json!({}))
            .kind(CallKind::Idempotent)
            .idempotency_key(" \t"),
    ];
    for req in cases {
        let tool = Tool::new(vec![ok(5_000, "only"), ok(1, "hedge")]);
        let layer = fixed(100, 3);
        let res = layer.layer(tool.clone()).oneshot(req).await.unwrap();
        assert_eq!(res.body, "only");
        assert_eq!(tool.calls(), 1);
        assert_eq!(layer.stats().hedges_sent(), 0);
        assert_eq!(
            layer.stats().eligible(),
            0,
            "not a call that could be hedged"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn keyed_idempotent_calls_are_hedged() {
    let tool = Tool::new(vec![ok(5_000, "first"), ok(1, "hedge")]);
    let req = ToolRequest::new("put", json!({}))
        .kind(CallKind::Idempotent)
        .idempotency_key("k1");
    let res = fixed(100, 1)
        .layer(tool.clone())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(res.body, "hedge");
    assert_eq!(tool.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn requests_of_unknown_kind_pass_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let svc = tower::service_fn(move |_req: String| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, ToolError>(String::from("done"))
        }
    });
    let res = fixed(10, 3)
        .layer(svc)
        .oneshot(String::from("q"))
        .await
        .unwrap();
    assert_eq!(res, "done");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn no_more_than_max_hedges_are_sent() {
    let tool = Tool::new(vec![ok(1_000, "first"), ok(1_000, "h1"), ok(1_000, "h2")]);
    let layer = fixed(100, 2);
    let start = Instant::now();
    let res = layer
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap();
    assert_eq!(res.body, "first");
    assert_eq!(start.elapsed(), Duration::from_millis(1_000));
    assert_eq!(tool.calls(), 3, "first + 2 hedges, at 0, 100 and 200 ms");
    assert_eq!(
        res.hedged,
        Some(Hedged {
            answered_by: 1,
            sent: 3
        })
    );
    assert!(tool.abandoned(1) && tool.abandoned(2));
    assert!(tool.attempt_cancelled(1) && tool.attempt_cancelled(2));
}

#[tokio::test(start_paused = true)]
async fn hedges_are_spaced_by_the_delay() {
    let tool = Tool::new(vec![ok(10_000, "x")]);
    let svc = fixed(100, 3).layer(tool.clone());
    let call = tokio::spawn(svc.oneshot(read("search")));
    settle().await;
    for (at, expected) in [(50, 1), (60, 2), (100, 3), (100, 4), (1_000, 4)] {
        advance(Duration::from_millis(at)).await;
        settle().await;
        assert_eq!(tool.calls(), expected, "after another {at} ms");
    }
    call.abort();
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_budget_sends_no_hedge() {
    // No tokens and no floor: nothing may be withdrawn.
    let budget = Arc::new(RetryBudget::new(0.0, 0, 1));
    let tool = Tool::new(vec![ok(1_000, "first"), ok(1, "hedge")]);
    let layer = fixed(100, 2).with_budget(budget);
    let res = layer
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap();
    assert_eq!(res.body, "first");
    assert_eq!(tool.calls(), 1);
    assert_eq!(layer.stats().budget_denied(), 1);
}

#[tokio::test(start_paused = true)]
async fn each_hedge_spends_a_budget_token() {
    // One token (a floor of 1/s, burst 1); the clock does not move between the calls.
    let budget = Arc::new(RetryBudget::new(0.0, 1, 1));
    let tool = Tool::new(vec![ok(1_000, "slow")]);
    let layer = fixed(100, 3).with_budget(budget.clone());
    let svc = layer.layer(tool.clone());
    let a = tokio::spawn(svc.clone().oneshot(read("search")));
    let b = tokio::spawn(svc.oneshot(read("search")));
    settle().await;
    advance(Duration::from_millis(150)).await;
    settle().await;
    assert_eq!(tool.calls(), 3, "two calls and one hedge");
    assert_eq!(layer.stats().hedges_sent(), 1);
    assert!(layer.stats().budget_denied() >= 1);
    a.abort();
    b.abort();
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_call_cancels_every_attempt_and_sends_no_more() {
    let tool = Tool::new(vec![ok(10_000, "x")]);
    let call_token = CancellationToken::new();
    let req = read("search").cancel_token(call_token.clone());
    let svc = fixed(100, 3).layer(tool.clone());
    let call = tokio::spawn(svc.oneshot(req));
    settle().await;
    advance(Duration::from_millis(150)).await;
    settle().await;
    assert_eq!(tool.calls(), 2);
    call_token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(tool.attempt_cancelled(0) && tool.attempt_cancelled(1));
    advance(Duration::from_secs(1)).await;
    assert_eq!(tool.calls(), 2, "no hedge after the call was cancelled");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_drops_and_cancels_every_attempt() {
    let tool = Tool::new(vec![ok(10_000, "x")]);
    let mut svc = fixed(100, 1).layer(tool.clone());
    let fut = svc.ready().await.unwrap().call(read("search"));
    let call = tokio::spawn(fut);
    settle().await;
    advance(Duration::from_millis(150)).await;
    settle().await;
    assert_eq!(tool.calls(), 2);
    call.abort();
    let _ = call.await;
    for i in 0..2 {
        assert!(tool.attempt_cancelled(i), "attempt {i} token cancelled");
        assert!(tool.abandoned(i), "attempt {i} future dropped");
    }
}

#[tokio::test(start_paused = true)]
async fn a_retriable_failure_sends_the_next_hedge_at_once() {
    let tool = Tool::new(vec![
        err(10, ErrorKind::UpstreamUnavailable),
        ok(10, "hedge"),
    ]);
    let start = Instant::now();
    let res = fixed(1_000, 1)
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap();
    assert_eq!(res.body, "hedge");
    assert_eq!(start.elapsed(), Duration::from_millis(20));
}

#[tokio::test(start_paused = true)]
async fn a_failure_does_not_end_the_call_while_another_attempt_runs() {
    // First sent at 0 fails at 150; the hedge sent at 100 answers at 300.
    let tool = Tool::new(vec![err(150, ErrorKind::Timeout), ok(200, "hedge")]);
    let layer = fixed(100, 1);
    let res = layer
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap();
    assert_eq!(res.body, "hedge");
    assert_eq!(tool.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_non_retriable_failure_ends_the_call_and_cancels_the_others() {
    let tool = Tool::new(vec![err(200, ErrorKind::InvalidInput), ok(10_000, "hedge")]);
    let start = Instant::now();
    let err = fixed(100, 1)
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert!(tool.attempt_cancelled(1) && tool.abandoned(1));
}

#[tokio::test(start_paused = true)]
async fn when_every_attempt_fails_the_last_failure_is_returned() {
    let tool = Tool::new(vec![
        err(10, ErrorKind::UpstreamUnavailable),
        err(10, ErrorKind::ConnectionFailed),
    ]);
    let err = fixed(100, 1)
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    assert_eq!(tool.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retriable_in_band_failure_is_not_a_win() {
    let mut first = ok(10, "failed in band");
    first.in_band = Some(ErrorKind::UpstreamUnavailable);
    let tool = Tool::new(vec![first, ok(10, "hedge")]);
    let res = fixed(1_000, 1)
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap();
    assert_eq!(res.body, "hedge");
}

#[tokio::test(start_paused = true)]
async fn the_percentile_delay_follows_recent_latencies() {
    let layer = HedgeLayer::new(
        HedgeDelay::percentile(90.0, Duration::from_millis(1), Duration::from_secs(5)),
        1,
    );
    assert_eq!(
        layer.delay().current(),
        Duration::from_secs(5),
        "max until known"
    );
    let tool = Tool::new(vec![ok(20, "warm")]);
    let svc = layer.layer(tool.clone());
    for _ in 0..40 {
        svc.clone().oneshot(read("search")).await.unwrap();
    }
    assert_eq!(layer.stats().hedges_sent(), 0);
    let delay = layer.delay().current();
    assert!(
        delay >= Duration::from_millis(20) && delay <= Duration::from_millis(23),
        "p90 of 20 ms calls read as {delay:?}"
    );

    // Now a slow call is hedged after ~20 ms, not after 5 s.
    let tool = Tool::new(vec![ok(10_000, "slow"), ok(20, "hedge")]);
    let start = Instant::now();
    let res = layer.layer(tool).oneshot(read("search")).await.unwrap();
    assert_eq!(res.body, "hedge");
    // The paused clock's timer fires on the next whole millisecond.
    let took = start.elapsed();
    assert!(
        took >= delay + Duration::from_millis(20) && took <= delay + Duration::from_millis(21),
        "hedged after {took:?} with a delay of {delay:?}"
    );

    // Slower calls move it up.
    let tool = Tool::new(vec![ok(200, "slower")]);
    let svc = HedgeLayer::new(
        HedgeDelay::percentile(90.0, Duration::from_millis(1), Duration::from_secs(5)),
        1,
    );
    let s = svc.layer(tool);
    for _ in 0..40 {
        s.clone().oneshot(read("search")).await.unwrap();
    }
    assert!(svc.delay().current() >= Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn the_percentile_delay_is_kept_within_min_and_max() {
    let layer = HedgeLayer::new(
        HedgeDelay::percentile(50.0, Duration::from_millis(50), Duration::from_millis(80)),
        1,
    );
    let svc = layer.layer(Tool::new(vec![ok(1, "fast")]));
    for _ in 0..40 {
        svc.clone().oneshot(read("search")).await.unwrap();
    }
    assert_eq!(layer.delay().current(), Duration::from_millis(50));
}

#[test]
fn config_lists_every_problem() {
    let cfg: HedgeConfig = serde_json::from_str(
        r#"{"enabled": true, "max_hedges": 0, "delay": {"percentile": 100, "min": "2s", "max": "1s"}}"#,
    )
    .unwrap();
    let err = cfg.validate().unwrap_err();
    let fields = toolshield_test::problem_fields(&err);
    assert_eq!(fields, ["max_hedges", "delay.percentile", "delay.min"]);

    let zero: HedgeConfig = serde_json::from_str(r#"{"delay": "0s", "max_hedges": 9}"#).unwrap();
    let err = zero.validate().unwrap_err();
    let fields = toolshield_test::problem_fields(&err);
    assert_eq!(fields, ["max_hedges", "delay"]);

    assert!(serde_json::from_str::<HedgeConfig>(r#"{"delays": "1s"}"#).is_err());
}

#[test]
fn a_mutating_tool_cannot_be_configured_for_hedging() {
    let on = HedgeConfig {
        enabled: true,
        ..HedgeConfig::default()
    };
    let err = on.validate_for_kind(CallKind::Mutating).unwrap_err();
    assert_eq!(toolshield_test::problem_fields(&err), ["enabled"]);
    assert!(on.validate_for_kind(CallKind::ReadOnly).is_ok());
    assert!(on.validate_for_kind(CallKind::Idempotent).is_ok());
    assert!(HedgeConfig::default()
        .validate_for_kind(CallKind::Mutating)
        .is_ok());
}

#[test]
fn from_config_is_off_unless_enabled() {
    assert!(HedgeLayer::from_config(&HedgeConfig::default())
        .unwrap()
        .is_none());
    let on = HedgeConfig {
        enabled: true,
        ..HedgeConfig::default()
    };
    assert!(HedgeLayer::from_config(&on).unwrap().is_some());
}

/// Random plans (latencies, retriable and fatal failures, delays, limits) checked against
/// the invariants: no more attempts than allowed, every attempt finished or dropped with
/// its token cancelled when the call ends, a success comes from an attempt that succeeded,
/// a fatal error from an attempt that failed so, and a call whose attempts all succeed
/// succeeds.
#[tokio::test(start_paused = true)]
async fn random_plans_keep_the_invariants() {
    for seed in 0..300u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let max_hedges = rng.u32(1..=3);
        let delay = rng.u64(5..=200);
        let plan: Vec<Step> = (0..4)
            .map(|_| {
                let ms = rng.u64(1..=400);
                match rng.u8(0..10) {
                    0..=6 => ok(ms, "ok"),
                    7 | 8 => err(ms, ErrorKind::UpstreamUnavailable),
                    _ => err(ms, ErrorKind::InvalidInput),
                }
            })
            .collect();
        let tool = Tool::new(plan.clone());
        let layer = fixed(delay, max_hedges);
        let out = layer.layer(tool.clone()).oneshot(read("search")).await;

        let calls = tool.calls();
        assert!(
            calls >= 1 && calls <= 1 + max_hedges as usize,
            "seed {seed}: {calls} calls"
        );
        let used = &plan[..calls];
        for (i, seen) in tool.seen.lock().unwrap().iter().enumerate() {
            let completed = seen.completed.load(Ordering::SeqCst);
            assert!(
                seen.dropped.load(Ordering::SeqCst),
                "seed {seed}: attempt {i} still running after the call ended"
            );
            if !completed {
                assert!(
                    seen.attempt.is_cancelled(),
                    "seed {seed}: loser {i} not cancelled"
                );
            }
            assert!(
                !seen.call.is_cancelled(),
                "seed {seed}: the call token was cancelled"
            );
        }
        match &out {
            Ok(res) => {
                assert!(used.iter().any(|s| s.out.is_ok()), "seed {seed}");
                let n = res.hedged.map_or(1, |h| h.answered_by) as usize;
                assert!(
                    plan[n - 1].out.is_ok(),
                    "seed {seed}: answered by failing attempt {n}"
                );
                if let Some(h) = res.hedged {
                    assert_eq!(h.sent as usize, calls, "seed {seed}");
                }
            }
            Err(e) if e.kind() == ErrorKind::InvalidInput => {
                assert!(
                    used.iter().any(|s| s.out == Err(ErrorKind::InvalidInput)),
                    "seed {seed}"
                );
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable, "seed {seed}");
                assert_eq!(calls, 1 + max_hedges as usize, "seed {seed}: gave up early");
                assert!(used.iter().all(|s| s.out.is_err()), "seed {seed}");
            }
        }
        if plan.iter().all(|s| s.out.is_ok()) {
            assert!(out.is_ok(), "seed {seed}");
        }
    }
}

/// An upstream's own 429 (or a full bulkhead, an open breaker) carried in the response,
/// as an HTTP service reports it, is a refusal like the same error: no hedge is sent
/// into it, and it is the answer only if nothing else answers.
#[tokio::test(start_paused = true)]
async fn an_in_band_refusal_sends_no_hedge_into_it() {
    for kind in [
        ErrorKind::RateLimited,
        ErrorKind::Overloaded,
        ErrorKind::CircuitOpen,
    ] {
        let mut refused = ok(10, "refused in band");
        refused.in_band = Some(kind);
        let tool = Tool::new(vec![refused, ok(10, "hedge")]);
        let start = Instant::now();
        let res = fixed(1_000, 2)
            .layer(tool.clone())
            .oneshot(read("search"))
            .await
            .unwrap();
        assert_eq!(res.body, "refused in band", "{kind:?}");
        assert_eq!(res.in_band, Some(kind));
        assert_eq!(
            tool.calls(),
            1,
            "{kind:?}: a hedge was sent into the refusal"
        );
        assert_eq!(start.elapsed(), Duration::from_millis(10));
    }
}

#[tokio::test(start_paused = true)]
async fn an_in_band_refusal_of_a_hedge_leaves_the_first_attempt_running() {
    let mut refused = ok(0, "refused in band");
    refused.in_band = Some(ErrorKind::RateLimited);
    let tool = Tool::new(vec![ok(300, "first"), refused, ok(0, "third")]);
    let res = fixed(100, 3)
        .layer(tool.clone())
        .oneshot(read("search"))
        .await
        .unwrap();
    assert_eq!(res.body, "first");
    assert_eq!(tool.calls(), 2, "no hedge after the refusal");
    assert!(!tool.attempt_cancelled(0));
}
