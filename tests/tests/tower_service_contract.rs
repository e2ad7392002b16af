//! tower's `Service` contract kept by toolshield's generic layers over any tower service:
//! every inner `call` follows a `poll_ready` that returned `Ready(Ok)` on that instance
//! (tower's `ConcurrencyLimit` panics otherwise), backpressure passes through and wakes,
//! a clone keeps its own readiness, an inner readiness error comes back classified, and a
//! dropped future gives back the permit it held. Inner services are tower's own
//! (`ConcurrencyLimit` of 1, `Buffer` of 1, `RateLimit`, `LoadShed`) and plain
//! `service_fn`s over `ToolRequest`, `http::Request<String>` and `String`. The last tests
//! check the claims of docs/layer-order.md that a test can check.
//!
//! The hedge, bulkhead and rate-limit layers have the same tests in their own crates
//! (`tests/tower_service_contract.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use serde_json::json;
use tokio::time::{advance, Instant};
use tokio_util::sync::CancellationToken;
use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry};
use toolshield_cancel::CancelLayer;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_fallback::FallbackLayer;
use toolshield_metrics::MetricsLayer;
use toolshield_retry::{BackoffStrategy, RetryLayer};
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::buffer::Buffer;
use tower::limit::{ConcurrencyLimit, RateLimit};
use tower::load_shed::LoadShed;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A waker that records that it was woken.
#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Flag {
    fn waker() -> (Arc<Flag>, Waker) {
        let flag = Arc::new(Flag::default());
        (Arc::clone(&flag), Waker::from(Arc::clone(&flag)))
    }

    fn woken(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// One `poll_ready` with `waker`.
fn ready_once<S: Service<Req>, Req>(svc: &mut S, waker: &Waker) -> Poll<Result<(), S::Error>> {
    svc.poll_ready(&mut Context::from_waker(waker))
}

/// Lets spawned tasks and timers run without moving the clock.
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// Counts calls in flight and the most seen at once.
#[derive(Default)]
struct Gauge {
    now: AtomicU32,
    max: AtomicU32,
    calls: AtomicU32,
}

struct InFlight(Arc<Gauge>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gauge {
    /// Enters a call; returns its number (0 for the first) and the guard that leaves it.
    fn enter(self: &Arc<Self>) -> (u32, InFlight) {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        (n, InFlight(Arc::clone(self)))
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    fn max(&self) -> u32 {
        self.max.load(Ordering::SeqCst)
    }
}

fn read(tool: &str) -> ToolRequest {
    ToolRequest::new(tool.to_owned(), json!({"q": "rust"})).kind(CallKind::ReadOnly)
}

fn web() -> http::Request<String> {
    http::Request::get("http://api.example.com/q")
        .body(String::new())
        .unwrap()
}

fn refused() -> BoxError {
    Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
}

type ToolFuture = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

/// A tool whose calls listed in `fail` (0-based) fail with `UPSTREAM_UNAVAILABLE` after
/// `work`, the others answer after `work`.
fn tool(
    gauge: &Arc<Gauge>,
    fail: &'static [u32],
    work: Duration,
) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future = ToolFuture>
       + Clone
       + Send
       + Sync
       + 'static {
    let gauge = Arc::clone(gauge);
    service_fn(move |_req: ToolRequest| -> ToolFuture {
        let (n, guard) = gauge.enter();
        Box::pin(async move {
            tokio::time::sleep(work).await;
            drop(guard);
            if fail.contains(&n) {
                Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
            } else {
                Ok(ToolResponse::new(json!(n)))
            }
        })
    })
}

type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

/// The same over `String`, with tower's `BoxError`.
fn plain(
    gauge: &Arc<Gauge>,
    fail: &'static [u32],
    work: Duration,
) -> impl Service<String, Response = String, Error = BoxError, Future = BoxFut<String>>
       + Clone
       + Send
       + Sync
       + 'static {
    let gauge = Arc::clone(gauge);
    service_fn(move |q: String| -> BoxFut<String> {
        let (n, guard) = gauge.enter();
        Box::pin(async move {
            tokio::time::sleep(work).await;
            drop(guard);
            if fail.contains(&n) {
                Err(refused())
            } else {
                Ok(format!("{q}:{n}"))
            }
        })
    })
}

/// The same over `http::Request<String>`.
fn http_svc(
    gauge: &Arc<Gauge>,
    fail: &'static [u32],
    work: Duration,
) -> impl Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = BoxError,
    Future = BoxFut<http::Response<String>>,
> + Clone
       + Send
       + Sync
       + 'static {
    let gauge = Arc::clone(gauge);
    service_fn(
        move |_req: http::Request<String>| -> BoxFut<http::Response<String>> {
            let (n, guard) = gauge.enter();
            Box::pin(async move {
                tokio::time::sleep(work).await;
                drop(guard);
                if fail.contains(&n) {
                    Err(refused())
                } else {
                    Ok(http::Response::new(n.to_string()))
                }
            })
        },
    )
}

/// A service whose `poll_ready` fails from its `fail_from`-th poll on (0-based, counted
/// across clones), and whose `call` records a call made without a ready poll.
#[derive(Clone)]
struct ReadyFails {
    polls: Arc<AtomicU32>,
    fail_from: u32,
    calls: Arc<AtomicU32>,
    ready: bool,
    unready_calls: Arc<AtomicU32>,
}

impl ReadyFails {
    fn new(fail_from: u32) -> Self {
        ReadyFails {
            polls: Arc::default(),
            fail_from,
            calls: Arc::default(),
            ready: false,
            unready_calls: Arc::default(),
        }
    }
}

impl<Req> Service<Req> for ReadyFails {
    type Response = String;
    type Error = BoxError;
    type Future = BoxFut<String>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.polls.fetch_add(1, Ordering::SeqCst) >= self.fail_from {
            return Poll::Ready(Err(refused()));
        }
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Req) -> Self::Future {
        if !std::mem::replace(&mut self.ready, false) {
            self.unready_calls.fetch_add(1, Ordering::SeqCst);
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        // Fails, so that a retry or a tier has to poll readiness again.
        Box::pin(async { Err(refused()) })
    }
}

fn no_backoff(attempts: u32) -> RetryLayer {
    RetryLayer::new(attempts).with_backoff(BackoffStrategy::none())
}

fn fixed_backoff(attempts: u32, wait: Duration) -> RetryLayer {
    RetryLayer::new(attempts).with_backoff(BackoffStrategy::fixed_range(wait, wait))
}

// ---------------------------------------------------------------------------------------
// Retry
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn every_retry_polls_a_concurrency_limit_of_one_ready_before_calling_it() {
    let work = Duration::from_millis(10);

    let gauge = Arc::new(Gauge::default());
    let svc = no_backoff(3).layer(ConcurrencyLimit::new(tool(&gauge, &[0, 1], work), 1));
    let res = svc
        .oneshot(read("lookup"))
        .await
        .expect("the third attempt answers");
    assert_eq!(res.output, json!(2));
    assert_eq!((gauge.calls(), gauge.max()), (3, 1));

    let gauge = Arc::new(Gauge::default());
    let svc = no_backoff(3).layer(ConcurrencyLimit::new(http_svc(&gauge, &[0, 1], work), 1));
    let res = svc.oneshot(web()).await.expect("the third attempt answers");
    assert_eq!(res.body(), "2");
    assert_eq!((gauge.calls(), gauge.max()), (3, 1));

    let gauge = Arc::new(Gauge::default());
    let svc = no_backoff(3).layer(ConcurrencyLimit::new(plain(&gauge, &[0, 1], work), 1));
    assert_eq!(svc.oneshot("q".to_owned()).await.unwrap(), "q:2");
    assert_eq!((gauge.calls(), gauge.max()), (3, 1));
}

#[tokio::test(start_paused = true)]
async fn retries_of_concurrent_calls_wait_for_a_shared_limit_of_one_instead_of_exceeding_it() {
    let gauge = Arc::new(Gauge::default());
    // Four failures in all: however they fall on the four calls, five attempts suffice.
    let inner = ConcurrencyLimit::new(tool(&gauge, &[0, 2, 4, 6], Duration::from_millis(30)), 1);
    let svc = no_backoff(5).without_budget().layer(inner);
    let mut calls = Vec::new();
    for _ in 0..4 {
        let svc = svc.clone();
        calls.push(tokio::spawn(svc.oneshot(read("lookup"))));
    }
    for call in calls {
        call.await
            .expect("no panic")
            .expect("every call answers in the end");
    }
    assert_eq!(gauge.max(), 1, "never two attempts in flight at once");
    assert_eq!(gauge.calls(), 8);
}

#[tokio::test(start_paused = true)]
async fn retry_over_a_buffer_of_one_keeps_the_buffer_contract() {
    let gauge = Arc::new(Gauge::default());
    let inner = Buffer::new(tool(&gauge, &[0, 1], Duration::from_millis(10)), 1);
    let svc = no_backoff(3).layer(inner);
    let a = tokio::spawn(svc.clone().oneshot(read("lookup")));
    let b = tokio::spawn(svc.oneshot(read("lookup")));
    a.await.unwrap().expect("a answers");
    b.await.unwrap().expect("b answers");
    assert_eq!(gauge.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn retry_is_pending_while_the_inner_limit_is_taken_and_wakes_when_it_frees() {
    let gauge = Arc::new(Gauge::default());
    let mut a = no_backoff(2).layer(ConcurrencyLimit::new(
        tool(&gauge, &[], Duration::from_secs(1)),
        1,
    ));
    let (_, noop) = Flag::waker();
    assert!(matches!(ready_once(&mut a, &noop), Poll::Ready(Ok(()))));
    // Cloned after `poll_ready`: the clone has no permit of its own and waits for one.
    let mut b = a.clone();
    let (flag, waker) = Flag::waker();
    assert!(
        ready_once(&mut b, &waker).is_pending(),
        "the only permit is a's"
    );
    let running = tokio::spawn(a.call(read("lookup")));
    settle().await;
    assert!(
        ready_once(&mut b, &waker).is_pending(),
        "a's call holds the permit"
    );
    assert!(!flag.woken());
    advance(Duration::from_secs(1)).await;
    running.await.unwrap().expect("a answers");
    assert!(flag.woken(), "b is woken when the permit is given back");
    assert!(matches!(ready_once(&mut b, &waker), Poll::Ready(Ok(()))));
    b.call(read("lookup")).await.expect("b answers");
}

#[tokio::test(start_paused = true)]
async fn retry_waits_for_a_rate_limit_between_attempts() {
    let gauge = Arc::new(Gauge::default());
    // tower's `RateLimit` is not `Clone`: behind a `Buffer`, as tower advises.
    let limited = RateLimit::new(
        tool(&gauge, &[0], Duration::ZERO),
        tower::limit::rate::Rate::new(1, Duration::from_secs(1)),
    );
    let inner = Buffer::new(limited, 1);
    let svc = no_backoff(2).layer(inner);
    let start = Instant::now();
    svc.oneshot(read("lookup"))
        .await
        .expect("the retry answers");
    assert_eq!(gauge.calls(), 2);
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "the retry waited for the rate limit's next period"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_backs_off_from_a_load_shed_rejection_and_tries_again() {
    let gauge = Arc::new(Gauge::default());
    let inner = LoadShed::new(ConcurrencyLimit::new(
        tool(&gauge, &[], Duration::from_secs(1)),
        1,
    ));
    let svc = fixed_backoff(3, Duration::from_secs(2)).layer(inner);
    let busy = tokio::spawn(svc.clone().oneshot(read("lookup")));
    settle().await;
    let shed = svc.oneshot(read("lookup")).await;
    busy.await.unwrap().expect("the first call answers");
    shed.expect("the shed call is retried after the limit frees");
    assert_eq!(gauge.calls(), 2, "the shed attempt never reached the tool");
}

#[tokio::test(start_paused = true)]
async fn an_inner_readiness_error_ends_a_retry_classified_and_without_a_call() {
    // Readiness fails at once: the caller's `poll_ready` reports it, classified.
    let inner = ReadyFails::new(0);
    let calls = Arc::clone(&inner.calls);
    let mut svc = no_backoff(3).layer(inner);
    let err = ServiceExt::<String>::ready(&mut svc)
        .await
        .err()
        .expect("readiness fails");
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Readiness fails before the retry: the call ends with that error, no second call.
    let inner = ReadyFails::new(1);
    let (calls, unready) = (Arc::clone(&inner.calls), Arc::clone(&inner.unready_calls));
    let err = no_backoff(3)
        .layer(inner)
        .oneshot("q".to_owned())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(unready.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_retry_dropped_while_waiting_for_readiness_gives_back_the_permit_it_was_handed() {
    let gauge = Arc::new(Gauge::default());
    let limit = ConcurrencyLimit::new(tool(&gauge, &[0], Duration::from_millis(100)), 1);
    let svc = fixed_backoff(2, Duration::from_millis(100)).layer(limit);
    // a: first attempt fails at 100 ms, backs off until 200 ms.
    let mut a = Box::pin(svc.clone().oneshot(read("lookup")));
    let (_, noop) = Flag::waker();
    let mut cx = Context::from_waker(&noop);
    assert!(a.as_mut().poll(&mut cx).is_pending());
    advance(Duration::from_millis(100)).await;
    assert!(a.as_mut().poll(&mut cx).is_pending(), "a backs off");
    // b takes the permit and holds it past a's backoff.
    let b = tokio::spawn(svc.clone().oneshot(read("lookup")));
    settle().await;
    advance(Duration::from_millis(100)).await;
    assert!(
        a.as_mut().poll(&mut cx).is_pending(),
        "a waits for b's permit"
    );
    advance(Duration::from_millis(50)).await;
    b.await.unwrap().expect("b answers");
    // The permit b gave back went to a's waiting retry; dropping a gives it back.
    drop(a);
    let mut c = svc.clone();
    let (_, waker) = Flag::waker();
    assert!(
        matches!(ready_once(&mut c, &waker), Poll::Ready(Ok(()))),
        "the permit is free again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_dropped_mid_attempt_gives_back_the_concurrency_permit() {
    let gauge = Arc::new(Gauge::default());
    let limit = ConcurrencyLimit::new(tool(&gauge, &[0], Duration::from_secs(10)), 1);
    let svc = no_backoff(2).layer(limit);
    let call = tokio::spawn(svc.clone().oneshot(read("lookup")));
    settle().await;
    call.abort();
    let _ = call.await;
    let mut next = svc.clone();
    let (_, waker) = Flag::waker();
    assert!(matches!(ready_once(&mut next, &waker), Poll::Ready(Ok(()))));
}

// ---------------------------------------------------------------------------------------
// Fallback
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_fallback_tier_sharing_the_primarys_limit_of_one_is_polled_ready_first() {
    let gauge = Arc::new(Gauge::default());
    let limit = ConcurrencyLimit::new(tool(&gauge, &[0], Duration::from_millis(10)), 1);
    let svc = FallbackLayer::new()
        .tier("same-limit", limit.clone())
        .layer(limit.clone());
    let res = svc.oneshot(read("lookup")).await.expect("the tier answers");
    assert_eq!(res.output, json!(1));
    assert_eq!((gauge.calls(), gauge.max()), (2, 1));

    let gauge = Arc::new(Gauge::default());
    let limit = ConcurrencyLimit::new(plain(&gauge, &[0], Duration::from_millis(10)), 1);
    let svc = FallbackLayer::<String, String>::new()
        .tier("same-limit", limit.clone())
        .layer(limit);
    assert_eq!(svc.oneshot("q".to_owned()).await.unwrap(), "q:1");
    assert_eq!((gauge.calls(), gauge.max()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn fallback_tiers_of_concurrent_calls_never_exceed_a_shared_limit_of_one() {
    let gauge = Arc::new(Gauge::default());
    let limit = ConcurrencyLimit::new(tool(&gauge, &[0], Duration::from_millis(30)), 1);
    let buffered = Buffer::new(limit.clone(), 1);
    let svc = FallbackLayer::new().tier("buffered", buffered).layer(limit);
    let mut calls = Vec::new();
    for _ in 0..4 {
        calls.push(tokio::spawn(svc.clone().oneshot(read("lookup"))));
    }
    for call in calls {
        call.await.expect("no panic").expect("every call answers");
    }
    assert_eq!((gauge.calls(), gauge.max()), (5, 1));
}

#[tokio::test(start_paused = true)]
async fn a_fallback_dropped_in_its_tier_gives_back_the_tiers_permit() {
    let gauge = Arc::new(Gauge::default());
    let tier_gauge = Arc::new(Gauge::default());
    let tier = ConcurrencyLimit::new(tool(&tier_gauge, &[], Duration::from_secs(10)), 1);
    let svc =
        FallbackLayer::new()
            .tier("slow", tier.clone())
            .layer(tool(&gauge, &[0], Duration::ZERO));
    let call = tokio::spawn(svc.oneshot(read("lookup")));
    settle().await;
    assert_eq!(tier_gauge.calls(), 1, "the tier is running");
    call.abort();
    let _ = call.await;
    let mut next = tier;
    let (_, waker) = Flag::waker();
    assert!(matches!(ready_once(&mut next, &waker), Poll::Ready(Ok(()))));
}

#[tokio::test(start_paused = true)]
async fn a_fallback_tiers_readiness_error_comes_back_classified() {
    let gauge = Arc::new(Gauge::default());
    let tier = ReadyFails::new(0);
    let calls = Arc::clone(&tier.calls);
    let svc = FallbackLayer::<String, String>::new()
        .tier("broken", tier)
        .layer(plain(&gauge, &[0], Duration::ZERO));
    let err = svc.oneshot("q".to_owned()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a tier that is not ready is not called"
    );
}

// ---------------------------------------------------------------------------------------
// Timeout, cancel, breaker, metrics: pass readiness through, free permits on drop
// ---------------------------------------------------------------------------------------

/// Asserts that `make(limit)` passes a taken limit's backpressure through, wakes when it
/// frees, and gives the permit back when a call is dropped.
async fn passes_backpressure_and_frees_on_drop<L>(layer: L)
where
    L: Layer<
        ConcurrencyLimit<tower::util::BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>>,
    >,
    L::Service:
        Service<ToolRequest, Response = ToolResponse, Error = ToolError> + Clone + Send + 'static,
    <L::Service as Service<ToolRequest>>::Future: Send + 'static,
{
    let gauge = Arc::new(Gauge::default());
    let inner = tower::util::BoxCloneSyncService::new(tool(&gauge, &[], Duration::from_secs(1)));
    let mut a = layer.layer(ConcurrencyLimit::new(inner, 1));
    let (_, noop) = Flag::waker();
    assert!(matches!(ready_once(&mut a, &noop), Poll::Ready(Ok(()))));
    let mut b = a.clone();
    let (flag, waker) = Flag::waker();
    assert!(
        ready_once(&mut b, &waker).is_pending(),
        "the clone waits for the permit"
    );
    let running = tokio::spawn(a.call(read("lookup")));
    advance(Duration::from_secs(1)).await;
    running.await.unwrap().expect("a answers");
    assert!(flag.woken(), "the waiting clone is woken");
    assert!(matches!(ready_once(&mut b, &waker), Poll::Ready(Ok(()))));
    // A call dropped mid-flight gives the permit back.
    let call = tokio::spawn(b.call(read("lookup")));
    settle().await;
    call.abort();
    let _ = call.await;
    let mut c = b.clone();
    assert!(matches!(ready_once(&mut c, &noop), Poll::Ready(Ok(()))));
}

#[tokio::test(start_paused = true)]
async fn timeout_deadline_cancel_breaker_and_metrics_pass_backpressure_and_free_permits() {
    passes_backpressure_and_frees_on_drop(TimeoutLayer::new(Duration::from_secs(30))).await;
    passes_backpressure_and_frees_on_drop(DeadlineLayer::new(Duration::from_secs(30))).await;
    passes_backpressure_and_frees_on_drop(CancelLayer::new()).await;
    passes_backpressure_and_frees_on_drop(BreakerLayer::default()).await;
    passes_backpressure_and_frees_on_drop(MetricsLayer::new(["lookup"]).unwrap()).await;
    passes_backpressure_and_frees_on_drop(no_backoff(3)).await;
    passes_backpressure_and_frees_on_drop(FallbackLayer::new()).await;
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_gives_back_its_concurrency_permit() {
    let gauge = Arc::new(Gauge::default());
    let svc = TimeoutLayer::new(Duration::from_secs(1)).layer(ConcurrencyLimit::new(
        tool(&gauge, &[], Duration::from_secs(60)),
        1,
    ));
    let err = svc.clone().oneshot(read("lookup")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let mut next = svc;
    let (_, waker) = Flag::waker();
    assert!(matches!(ready_once(&mut next, &waker), Poll::Ready(Ok(()))));
}

#[tokio::test(start_paused = true)]
async fn a_call_cancelled_mid_flight_gives_back_its_concurrency_permit() {
    let gauge = Arc::new(Gauge::default());
    let svc = CancelLayer::new().layer(ConcurrencyLimit::new(
        tool(&gauge, &[], Duration::from_secs(60)),
        1,
    ));
    let token = CancellationToken::new();
    let call = tokio::spawn(
        svc.clone()
            .oneshot(read("lookup").cancel_token(token.clone())),
    );
    settle().await;
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    let mut next = svc;
    let (_, waker) = Flag::waker();
    assert!(matches!(ready_once(&mut next, &waker), Poll::Ready(Ok(()))));
}

#[tokio::test(start_paused = true)]
async fn every_generic_layer_reports_an_inner_readiness_error_classified() {
    async fn check<L>(layer: L)
    where
        L: Layer<ReadyFails>,
        L::Service: Service<String, Error = ToolError>,
    {
        let mut svc = layer.layer(ReadyFails::new(0));
        let err = ServiceExt::<String>::ready(&mut svc)
            .await
            .err()
            .expect("not ready");
        assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    }
    check(TimeoutLayer::new(Duration::from_secs(1))).await;
    check(DeadlineLayer::new(Duration::from_secs(1))).await;
    check(CancelLayer::new()).await;
    check(BreakerLayer::default()).await;
    check(MetricsLayer::new(["lookup"]).unwrap()).await;
    check(no_backoff(3)).await;
    check(FallbackLayer::<String, String>::new()).await;
}

// ---------------------------------------------------------------------------------------
// docs/layer-order.md
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn fallback_outside_retry_hands_over_only_once_the_retries_are_spent() {
    let primary = Arc::new(Gauge::default());
    let backup = Arc::new(Gauge::default());
    let svc = FallbackLayer::new()
        .tier("backup", tool(&backup, &[], Duration::ZERO))
        .layer(no_backoff(3).layer(tool(&primary, &[0, 1, 2], Duration::ZERO)));
    svc.clone()
        .oneshot(read("lookup"))
        .await
        .expect("the tier answers");
    assert_eq!((primary.calls(), backup.calls()), (3, 1));

    // A transient failure the retry absorbs never reaches the tier.
    let primary = Arc::new(Gauge::default());
    let backup = Arc::new(Gauge::default());
    let svc = FallbackLayer::new()
        .tier("backup", tool(&backup, &[], Duration::ZERO))
        .layer(no_backoff(3).layer(tool(&primary, &[0], Duration::ZERO)));
    svc.oneshot(read("lookup"))
        .await
        .expect("the retry answers");
    assert_eq!((primary.calls(), backup.calls()), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn cancel_outside_retry_stops_a_backoff_wait_and_every_later_attempt() {
    let gauge = Arc::new(Gauge::default());
    let svc = CancelLayer::new().layer(fixed_backoff(3, Duration::from_secs(10)).layer(tool(
        &gauge,
        &[0, 1],
        Duration::ZERO,
    )));
    let token = CancellationToken::new();
    let start = Instant::now();
    let call = tokio::spawn(svc.oneshot(read("lookup").cancel_token(token.clone())));
    settle().await;
    advance(Duration::from_secs(1)).await;
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(gauge.calls(), 1, "no attempt after the cancellation");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the backoff was cut short"
    );
}

#[tokio::test(start_paused = true)]
async fn a_total_deadline_outside_retry_returns_the_last_error_instead_of_waiting_past_it() {
    let gauge = Arc::new(Gauge::default());
    let svc = DeadlineLayer::new(Duration::from_secs(1)).layer(
        fixed_backoff(3, Duration::from_secs(5)).layer(tool(&gauge, &[0, 1, 2], Duration::ZERO)),
    );
    let start = Instant::now();
    let err = svc.oneshot(read("lookup")).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::UpstreamUnavailable,
        "the last error, not TIMEOUT"
    );
    assert_eq!(gauge.calls(), 1);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "no sleep into the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_outside_the_breaker_stops_at_the_circuit_open_it_meets_mid_call() {
    let gauge = Arc::new(Gauge::default());
    let registry = BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 2,
        ..BreakerConfig::default()
    })
    .unwrap();
    let svc = no_backoff(5)
        .without_budget()
        .layer(BreakerLayer::new(registry).layer(tool(&gauge, &[0, 1, 2, 3, 4], Duration::ZERO)));
    let err = svc.oneshot(read("lookup")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(
        gauge.calls(),
        2,
        "the third attempt was refused, and not retried"
    );
}
