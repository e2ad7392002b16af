//! [`Fallback`]: the primary service and its chain.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use toolshield_contract::IntoToolError;
use toolshield_contract::{CallKind, ShieldRequest, ShieldResponse, ToolError};
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::shared::Shared;
use crate::stats::FallbackStats;

/// Calls the primary service and, when it fails in a way a tier accepts, the tiers in
/// order.
pub struct Fallback<S, Req, Res> {
    inner: S,
    shared: Arc<Shared<Req, Res>>,
}

impl<S: Clone, Req, Res> Clone for Fallback<S, Req, Res> {
    fn clone(&self) -> Self {
        Fallback {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, Req, Res> fmt::Debug for Fallback<S, Req, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("inner", &self.inner)
            .field("tiers", &self.shared.tiers.len())
            .finish()
    }
}

impl<S, Req, Res> Fallback<S, Req, Res> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<Req, Res>>) -> Self {
        Fallback { inner, shared }
    }

    /// Hand-over counters of this chain (shared by every clone).
    pub fn stats(&self) -> &FallbackStats {
        &self.shared.stats
    }

    /// The primary service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The primary service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the primary service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req, Res> Service<Req> for Fallback<S, Req, Res>
where
    S: Service<Req, Response = Res>,
    S::Error: IntoToolError,
    Req: ShieldRequest + Clone + Send + 'static,
    Res: ShieldResponse + Send + 'static,
{
    type Response = Res;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future, Req, Res>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        // The call's own tokens before the copy is made: the copy shares them.
        toolshield_contract::own_call(&mut req);
        // Only keep a copy of the request (a few refcounts) when there is somewhere to go.
        let keep = (!self.shared.tiers.is_empty()).then(|| req.clone());
        let mutating = req.call_kind() == Some(CallKind::Mutating);
        ResponseFuture::new(self.inner.call(req), keep, self.shared.clone(), mutating)
    }
}
