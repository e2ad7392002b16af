//! Calling a service from a test.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use tower::{Service, ServiceExt};

/// Waits for `svc` to be ready, then calls it with `req`: one call of a service the test
/// keeps (unlike `oneshot`, which consumes it).
///
/// ```
/// use serde_json::json;
/// use toolshield_core::ToolRequest;
/// use toolshield_test::{call, BareTool};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut tool = BareTool;
/// assert!(call(&mut tool, ToolRequest::new("t", json!(null))).await.is_ok());
/// # }
/// ```
pub async fn call<S, Req>(svc: &mut S, req: Req) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
{
    svc.ready().await?.call(req).await
}

/// Polls `svc` for readiness and its response future once each, with a no-op waker,
/// outside any runtime: for services that answer at once, as the allocation tests need.
///
/// # Panics
///
/// If the service is not ready or its future is pending on the first poll.
///
/// ```
/// use serde_json::json;
/// use toolshield_core::ToolRequest;
/// use toolshield_test::{call_now, BareTool};
///
/// assert!(call_now(&mut BareTool, ToolRequest::new("t", json!(null))).is_ok());
/// ```
pub fn call_now<S, Req>(svc: &mut S, req: Req) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
{
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(e)) => return Err(e),
        Poll::Pending => panic!("call_now: the service is not ready"),
    }
    let fut = pin!(svc.call(req));
    match fut.poll(&mut cx) {
        Poll::Ready(r) => r,
        Poll::Pending => panic!("call_now: the response future is pending"),
    }
}

/// Polls `fut` to completion on the current thread with a no-op waker, spinning while it
/// is pending: no executor, so every entry of a bench group pays the same (nothing) for
/// one. Only for futures that make progress without being woken (no timers, no I/O).
///
/// ```
/// assert_eq!(toolshield_test::block_on(async { 7 }), 7);
/// ```
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

/// One call through `svc` with [`block_on`]: polls readiness once (ignoring the answer,
/// as a service that is always ready gives), calls, and waits for the response.
///
/// ```
/// use serde_json::json;
/// use toolshield_core::ToolRequest;
/// use toolshield_test::{call_blocking, BareTool};
///
/// assert!(call_blocking(&mut BareTool, ToolRequest::new("t", json!(null))).is_ok());
/// ```
pub fn call_blocking<S, Req>(svc: &mut S, req: Req) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
{
    let mut cx = Context::from_waker(Waker::noop());
    let _ = svc.poll_ready(&mut cx);
    block_on(svc.call(req))
}

// ----- dropping a call at every await -----

/// How driving a future for at most a number of polls ended.
#[derive(Debug)]
pub enum Driven<T> {
    /// It finished within the polls, with this output.
    Finished(T),
    /// It was still pending after the last poll, and was dropped there.
    Dropped,
}

impl<T> Driven<T> {
    /// Whether the future finished.
    pub fn finished(&self) -> bool {
        matches!(self, Driven::Finished(_))
    }
}

/// Polls `fut` at most `polls` times, letting the runtime (and a paused clock) run between
/// polls, and drops it right after the last poll if it is still pending. With `polls = 0`
/// the future is dropped without ever being polled.
pub async fn drive<F: Future>(fut: F, polls: usize) -> Driven<F::Output> {
    if polls == 0 {
        drop(fut);
        return Driven::Dropped;
    }
    let mut fut = pin!(fut);
    let mut done = 0;
    poll_fn(|cx| {
        done += 1;
        match fut.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Driven::Finished(out)),
            Poll::Pending if done >= polls => Poll::Ready(Driven::Dropped),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// How many polls `fut` takes to finish, and its output.
pub async fn polls_to_finish<F: Future>(fut: F) -> (usize, F::Output) {
    let mut fut = pin!(fut);
    let mut done = 0;
    let out = poll_fn(|cx| {
        done += 1;
        fut.as_mut().poll(cx)
    })
    .await;
    (done, out)
}
