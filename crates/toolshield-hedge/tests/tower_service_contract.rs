//! tower's `Service` contract kept by the hedge layer over any tower service: every
//! hedge polls its service ready before calling it, so hedges of one call wait for an
//! inner concurrency limit of one instead of exceeding it (tower's `ConcurrencyLimit`
//! panics on a call made without a permit); backpressure passes through and wakes; a
//! clone keeps its own readiness; a readiness error comes back classified; a dropped
//! call gives back every permit it held or was handed. Paused clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_contract::{CallKind, ErrorKind, ToolError};
use toolshield_core::{ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

// ---------------------------------------------------------------------------------------
// A concurrency limit of one with tower's `ConcurrencyLimit` contract: `poll_ready`
// reserves the permit on that instance (a clone starts without one), `call` without a
// reserved permit panics as tower's does, the response future holds the permit until it
// ends or is dropped, and a dropped instance gives back a permit it reserved.
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct LimitState {
    taken: bool,
    waiters: Vec<Waker>,
    in_flight: u32,
    max_in_flight: u32,
    calls: u32,
}

struct Limit1<S> {
    inner: S,
    state: Arc<Mutex<LimitState>>,
    holds: bool,
}

impl<S> Limit1<S> {
    fn new(inner: S) -> Self {
        Limit1 {
            inner,
            state: Arc::default(),
            holds: false,
        }
    }

    fn calls(&self) -> u32 {
        self.state.lock().unwrap().calls
    }

    fn max_in_flight(&self) -> u32 {
        self.state.lock().unwrap().max_in_flight
    }

    fn taken(&self) -> bool {
        self.state.lock().unwrap().taken
    }
}

fn release(state: &Mutex<LimitState>) {
    let waiters = {
        let mut s = state.lock().unwrap();
        s.taken = false;
        std::mem::take(&mut s.waiters)
    };
    waiters.into_iter().for_each(Waker::wake);
}

impl<S: Clone> Clone for Limit1<S> {
    fn clone(&self) -> Self {
        Limit1 {
            inner: self.inner.clone(),
            state: Arc::clone(&self.state),
            holds: false,
        }
    }
}

impl<S> Drop for Limit1<S> {
    fn drop(&mut self) {
        if self.holds {
            release(&self.state);
        }
    }
}

struct Permit(Arc<Mutex<LimitState>>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.lock().unwrap().in_flight -= 1;
        release(&self.0);
    }
}

impl<S, Req> Service<Req> for Limit1<S>
where
    S: Service<Req>,
    S::Future: Send + 'static,
    S::Response: 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.holds {
            let mut s = self.state.lock().unwrap();
            if s.taken {
                s.waiters.push(cx.waker().clone());
                return Poll::Pending;
            }
            s.taken = true;
            self.holds = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        assert!(self.holds, "poll_ready must be called first");
        self.holds = false;
        {
            let mut s = self.state.lock().unwrap();
            s.calls += 1;
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
        }
        let permit = Permit(Arc::clone(&self.state));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let out = fut.await;
            drop(permit);
            out
        })
    }
}

#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn flag() -> (Arc<Flag>, Waker) {
    let flag = Arc::new(Flag::default());
    (Arc::clone(&flag), Waker::from(Arc::clone(&flag)))
}

fn ready_once<S: Service<Req>, Req>(svc: &mut S, waker: &Waker) -> Poll<Result<(), S::Error>> {
    svc.poll_ready(&mut Context::from_waker(waker))
}

async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

fn read() -> ToolRequest {
    ToolRequest::new("search", json!({"q": "rust"})).kind(CallKind::ReadOnly)
}

type ToolFuture = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

/// Call `n` (0-based) takes `work[n]` (the last entry for later calls) and fails with
/// `UPSTREAM_UNAVAILABLE` when `n` is in `fail`.
fn tool(
    work: &'static [u64],
    fail: &'static [u32],
) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future = ToolFuture> + Clone
{
    let calls = Arc::new(AtomicU32::new(0));
    service_fn(move |_req: ToolRequest| -> ToolFuture {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let ms = work[(n as usize).min(work.len() - 1)];
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if fail.contains(&n) {
                Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
            } else {
                Ok(ToolResponse::new(json!(n)))
            }
        })
    })
}

fn hedge(max: u32) -> HedgeLayer {
    HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), max)
}

#[tokio::test(start_paused = true)]
async fn hedges_wait_for_an_inner_limit_of_one_instead_of_exceeding_it() {
    // The first attempt is slower than the hedge delay: the hedge is due, but the only
    // permit is the first attempt's, so it waits; the first attempt answers.
    let limit = Limit1::new(tool(&[1_000], &[]));
    let svc = hedge(2).layer(limit.clone());
    let res = svc
        .oneshot(read())
        .await
        .expect("the first attempt answers");
    assert_eq!(res.output, json!(0));
    assert_eq!((limit.calls(), limit.max_in_flight()), (1, 1));
    assert!(
        !limit.taken(),
        "the hedge that waited gave its reservation back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hedge_sent_after_a_failure_is_polled_ready_on_the_freed_limit() {
    let limit = Limit1::new(tool(&[10, 10], &[0]));
    let svc = hedge(1).layer(limit.clone());
    let res = svc.oneshot(read()).await.expect("the hedge answers");
    assert_eq!(res.output, json!(1));
    assert_eq!((limit.calls(), limit.max_in_flight()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn concurrent_hedged_calls_never_exceed_a_shared_limit_of_one() {
    let limit = Limit1::new(tool(&[300, 50], &[0, 3]));
    let svc = hedge(3).layer(limit.clone());
    let mut calls = Vec::new();
    for _ in 0..4 {
        calls.push(tokio::spawn(svc.clone().oneshot(read())));
    }
    for call in calls {
        call.await.expect("no panic").expect("every call answers");
    }
    assert_eq!(limit.max_in_flight(), 1);
    assert!(!limit.taken());
}

#[tokio::test(start_paused = true)]
async fn hedge_is_pending_while_the_inner_limit_is_taken_and_wakes_when_it_frees() {
    let limit = Limit1::new(tool(&[1_000], &[]));
    let mut a = hedge(1).layer(limit.clone());
    let (_, noop) = flag();
    assert!(matches!(ready_once(&mut a, &noop), Poll::Ready(Ok(()))));
    let mut b = a.clone();
    let (woken, waker) = flag();
    assert!(
        ready_once(&mut b, &waker).is_pending(),
        "a clone has no permit of its own"
    );
    let running = tokio::spawn(a.call(read()));
    settle().await;
    assert!(ready_once(&mut b, &waker).is_pending());
    advance(Duration::from_secs(1)).await;
    running.await.unwrap().expect("a answers");
    settle().await;
    assert!(
        woken.0.load(Ordering::SeqCst),
        "b is woken when the permit is free"
    );
    assert!(matches!(ready_once(&mut b, &waker), Poll::Ready(Ok(()))));
    b.call(read()).await.expect("b answers");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_hedged_call_gives_back_every_permit_it_held_or_was_handed() {
    // Dropped while the first attempt runs and the hedge waits for the permit.
    let limit = Limit1::new(tool(&[1_000], &[]));
    let svc = hedge(1).layer(limit.clone());
    let call = tokio::spawn(svc.clone().oneshot(read()));
    settle().await;
    advance(Duration::from_millis(150)).await;
    settle().await;
    call.abort();
    let _ = call.await;
    assert!(!limit.taken(), "the running attempt's permit is back");

    // Dropped after the first attempt failed and the permit went to the waiting hedge.
    let limit = Limit1::new(tool(&[200, 1_000], &[0]));
    let svc = hedge(1).layer(limit.clone());
    let mut fut = Box::pin(svc.clone().oneshot(read()));
    let (_, noop) = flag();
    let mut cx = Context::from_waker(&noop);
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    advance(Duration::from_millis(150)).await;
    assert!(
        fut.as_mut().poll(&mut cx).is_pending(),
        "the hedge is due, the permit taken"
    );
    advance(Duration::from_millis(60)).await;
    assert!(fut.as_mut().poll(&mut cx).is_pending(), "the hedge runs");
    drop(fut);
    assert!(!limit.taken(), "the hedge's permit is back");
    let mut next = svc;
    assert!(matches!(ready_once(&mut next, &noop), Poll::Ready(Ok(()))));
}

/// A service whose `poll_ready` fails from its `fail_from`-th poll on (counted across
/// clones); its calls fail with a retriable error after 200 ms.
#[derive(Clone)]
struct ReadyFails {
    polls: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
    fail_from: u32,
}

impl Service<ToolRequest> for ReadyFails {
    type Response = ToolResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<ToolResponse, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.polls.fetch_add(1, Ordering::SeqCst) >= self.fail_from {
            let e = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
            return Poll::Ready(Err(Box::new(e)));
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(ToolResponse::new(json!("first")))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn an_inner_readiness_error_comes_back_classified() {
    let broken = ReadyFails {
        polls: Arc::default(),
        calls: Arc::default(),
        fail_from: 0,
    };
    let mut svc = hedge(1).layer(broken.clone());
    let err = ServiceExt::<ToolRequest>::ready(&mut svc)
        .await
        .err()
        .expect("not ready");
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);

    // The hedge's readiness fails: hedging ends, the first attempt still answers.
    let flaky = ReadyFails {
        polls: Arc::default(),
        calls: Arc::default(),
        fail_from: 1,
    };
    let calls = Arc::clone(&flaky.calls);
    let res = hedge(2).layer(flaky).oneshot(read()).await;
    assert_eq!(
        res.expect("the first attempt answers").output,
        json!("first")
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no hedge without readiness"
    );
}

#[tokio::test(start_paused = true)]
async fn calls_that_are_not_hedged_pass_through_a_limit_of_one_untouched() {
    let limit = Limit1::new(service_fn(|q: String| async move { Ok::<_, BoxError>(q) }));
    let svc = hedge(2).layer(limit.clone());
    assert_eq!(svc.oneshot("q".to_owned()).await.unwrap(), "q");
    assert_eq!(limit.calls(), 1);
}
