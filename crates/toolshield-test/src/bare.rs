//! [`BareTool`], the tool that does nothing, and [`FailOnPayload`], the tool that fails when told.

use std::future::{ready, Ready};
use std::task::{Context, Poll};

use serde_json::{json, Value};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::Service;

/// A tool that is always ready and answers at once with the output `true`.
///
/// Building its response allocates nothing (`true` needs no heap), so every allocation a
/// test or bench sees around it belongs to the layers under test.
///
/// ```
/// use serde_json::{json, Value};
/// use toolshield_core::ToolRequest;
/// use toolshield_test::{call_now, BareTool};
///
/// let mut tool = BareTool;
/// let resp = call_now(&mut tool, ToolRequest::new("t", json!(null))).unwrap();
/// assert_eq!(resp.output, Value::Bool(true));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct BareTool;

impl Service<ToolRequest> for BareTool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        ready(Ok(ToolResponse::new(Value::Bool(true))))
    }
}

/// A tool that is always ready and answers at once: it fails with `kind` (message
/// `"down"`) when the payload field `field` is the string `"fail"`, and otherwise answers
/// `{"ok": true}`. A breaker test opens and closes circuits by the payload it sends.
///
/// ```
/// use serde_json::json;
/// use toolshield_core::{ErrorKind, ToolRequest};
/// use toolshield_test::{call_now, FailOnPayload};
///
/// let mut tool = FailOnPayload::new("r", ErrorKind::UpstreamUnavailable);
/// let fail = call_now(&mut tool, ToolRequest::new("t", json!({"r": "fail"})));
/// assert_eq!(fail.unwrap_err().kind(), ErrorKind::UpstreamUnavailable);
/// let ok = call_now(&mut tool, ToolRequest::new("t", json!({"r": "ok"}))).unwrap();
/// assert_eq!(ok.output, json!({"ok": true}));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct FailOnPayload {
    field: &'static str,
    kind: ErrorKind,
}

impl FailOnPayload {
    /// Fails with `kind` when the payload's `field` is `"fail"`.
    #[must_use]
    pub fn new(field: &'static str, kind: ErrorKind) -> Self {
        FailOnPayload { field, kind }
    }
}

impl Service<ToolRequest> for FailOnPayload {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        ready(if req.payload()[self.field] == "fail" {
            Err(ToolError::new(self.kind, "down"))
        } else {
            Ok(ToolResponse::new(json!({"ok": true})))
        })
    }
}

/// A tool that is always ready and answers `true` on the second poll of its future: the
/// first poll wakes the task and returns `Pending`, as a tool waiting on I/O does. A layer
/// that does work only once its inner future is pending (arms a timer, registers a
/// waiter) does it for this tool and not for [`BareTool`]. Like `BareTool`, it allocates
/// nothing.
///
/// ```
/// use std::future::Future;
/// use std::pin::pin;
/// use std::task::{Context, Poll, Waker};
/// use serde_json::json;
/// use toolshield_core::ToolRequest;
/// use tower::Service;
/// use toolshield_test::PendingOnceTool;
///
/// let mut tool = PendingOnceTool;
/// let mut fut = pin!(tool.call(ToolRequest::new("t", json!(null))));
/// let mut cx = Context::from_waker(Waker::noop());
/// assert!(fut.as_mut().poll(&mut cx).is_pending());
/// assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingOnceTool;

/// The future of [`PendingOnceTool`].
#[derive(Debug)]
pub struct PendingOnce {
    polled: bool,
}

impl std::future::Future for PendingOnce {
    type Output = Result<ToolResponse, ToolError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polled {
            return Poll::Ready(Ok(ToolResponse::new(Value::Bool(true))));
        }
        self.polled = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Service<ToolRequest> for PendingOnceTool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = PendingOnce;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        PendingOnce { polled: false }
    }
}
