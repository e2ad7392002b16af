//! Calling a service from a test.

use std::future::Future;
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
