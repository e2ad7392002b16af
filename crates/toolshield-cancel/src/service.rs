//! [`Cancel`]: checks the call token, then races it against the call.

use std::task::{Context, Poll};

use toolshield_contract::IntoToolError;
use toolshield_contract::{ShieldRequest, ToolError};
use tower_service::Service;

use crate::future::ResponseFuture;

/// Checks the call token before calling the inner service and races it against the call.
#[derive(Debug, Clone)]
pub struct Cancel<S> {
    inner: S,
}

impl<S> Cancel<S> {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: S) -> Self {
        Cancel { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for Cancel<S>
where
    S: Service<Req>,
    S::Error: IntoToolError,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline(always)]
    fn call(&mut self, mut req: Req) -> Self::Future {
        // The call's own tokens before this layer keeps a copy of them (a clone of a
        // template would otherwise look shared to the layers inside).
        toolshield_contract::own_call(&mut req);
        match req.call_state().map(|s| s.tokens().clone()) {
            Some(tokens) if tokens.call().is_cancelled() => ResponseFuture::rejected(),
            Some(tokens) => ResponseFuture::racing(self.inner.call(req), tokens),
            None => ResponseFuture::plain(self.inner.call(req)),
        }
    }
}
