//! [`StoreService`]: the service of a store-backed layer, and [`StorePath`], what the
//! layer does with one call.

use std::task::{Context, Poll};

use toolshield_contract::IntoToolError;
use toolshield_contract::ToolError;
use tower_service::Service;

use crate::future::LayerFuture;

/// What a store-backed layer (the cache, idempotency) does with one call: let it through,
/// answer it at once, or take it down the layer's boxed path through the store. The
/// action lives here; the tower plumbing (readiness, clones, `get_ref`) in
/// [`StoreService`].
///
/// Implemented by the layer type itself (cheap to clone: an `Arc` to the shared state).
pub trait StorePath<Req>: Clone {
    /// The response of the service.
    type Response;

    /// Serves `req` with `inner`, which is ready: [`LayerFuture::passthrough`] of
    /// `inner.call(req)`, a [`LayerFuture::ready`] answer, or a [`LayerFuture::boxed`]
    /// path that takes the ready service along ([`take_ready`]).
    fn call<S>(&self, inner: &mut S, req: Req) -> LayerFuture<S::Future, Self::Response>
    where
        S: Service<Req, Response = Self::Response> + Clone + Send + 'static,
        S::Error: IntoToolError + Send,
        S::Future: Send + 'static;
}

/// Takes the ready service out of `inner` for a future to own, leaving an unready clone
/// in its place (the service polls readiness again before its next call).
pub fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// The service of a store-backed layer: the inner service and the layer (`L`, an `Arc` to
/// the state every clone shares: the store, counters, single-flight table). What it does
/// with a call is `L`'s [`StorePath`]; readiness is the inner service's.
pub struct StoreService<S, L> {
    inner: S,
    layer: L,
}

impl<S, L> StoreService<S, L> {
    /// `inner` behind `layer`.
    pub fn new(inner: S, layer: L) -> Self {
        StoreService { inner, layer }
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

    /// The layer this service was built by.
    pub fn layer(&self) -> &L {
        &self.layer
    }
}

impl<S: Clone, L: Clone> Clone for StoreService<S, L> {
    fn clone(&self) -> Self {
        StoreService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: std::fmt::Debug, L: std::fmt::Debug> std::fmt::Debug for StoreService<S, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, L, Req> Service<Req> for StoreService<S, L>
where
    L: StorePath<Req>,
    S: Service<Req, Response = L::Response> + Clone + Send + 'static,
    S::Error: IntoToolError + Send,
    S::Future: Send + 'static,
{
    type Response = L::Response;
    type Error = ToolError;
    type Future = LayerFuture<S::Future, L::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline(always)]
    fn call(&mut self, req: Req) -> Self::Future {
        self.layer.call(&mut self.inner, req)
    }
}
