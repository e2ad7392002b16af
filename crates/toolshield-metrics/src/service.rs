//! [`Metrics`] and [`AttemptMetrics`]: wrap the inner service.

use std::sync::Arc;
use std::task::{Context, Poll};

use toolshield_contract::time;
use toolshield_contract::IntoToolError;
use toolshield_contract::{CallKind, ShieldRequest, ShieldResponse, ToolError};
use tower_service::Service;
use tracing::field::Empty;
use tracing::Span;

use crate::future::{AttemptFuture, ResponseFuture};
use crate::handles::Shared;

/// Records the metrics and span of each logical call; built by
/// [`MetricsLayer`](crate::MetricsLayer).
#[derive(Debug)]
pub struct Metrics<S> {
    inner: S,
    shared: Arc<Shared>,
    slot: Option<usize>,
    /// Whether a read-only call that was not a hit counts as a cache miss.
    cache_misses: bool,
}

/// Inlined into the clone around it: a stack is cloned for each call, and the outermost
/// layer's clone made out of line builds the whole stack aside and then copies it.
impl<S: Clone> Clone for Metrics<S> {
    #[inline(always)]
    fn clone(&self) -> Self {
        Metrics {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            slot: self.slot,
            cache_misses: self.cache_misses,
        }
    }
}

impl<S> Metrics<S> {
    pub(crate) fn new(
        inner: S,
        shared: Arc<Shared>,
        slot: Option<usize>,
        cache_misses: bool,
    ) -> Self {
        Metrics {
            inner,
            shared,
            slot,
            cache_misses,
        }
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

/// The name of a request that names nothing (a plain value).
const UNNAMED: &str = "default";

/// The name a call of a layer made for no one tool is counted under: its own name;
/// names the exporter does not know are counted as `other`.
fn label<Req: ShieldRequest>(req: &Req) -> &str {
    req.call_name().unwrap_or(UNNAMED)
}

impl<S, Req> Service<Req> for Metrics<S>
where
    S: Service<Req>,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
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
        // The call's entry stamp (one clock read per call), shared with every layer inside.
        let start = time::enter(&mut req);
        let shared = &self.shared;
        let meta = req.call_meta();
        let tool = self.slot.unwrap_or_else(|| shared.tools.index(label(&req)));
        let counts_miss = self.cache_misses && req.call_kind() == Some(CallKind::ReadOnly);
        let span = if shared.spans {
            tracing::info_span!(
                target: "toolshield",
                "tool_execution",
                tool = req.call_name().unwrap_or(UNNAMED),
                trace_id = meta.trace_id,
                run_id = meta.run_id,
                attempts = Empty,
                outcome = Empty,
                cache_hit = Empty,
                error_code = Empty,
            )
        } else {
            Span::none()
        };
        let future = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        ResponseFuture::new(future, start, tool, counts_miss, span, Arc::clone(shared))
    }
}

/// Records the metrics and span of each attempt; built by
/// [`AttemptMetricsLayer`](crate::AttemptMetricsLayer).
#[derive(Debug, Clone)]
pub struct AttemptMetrics<S> {
    inner: S,
    shared: Arc<Shared>,
    slot: Option<usize>,
}

impl<S> AttemptMetrics<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, slot: Option<usize>) -> Self {
        AttemptMetrics {
            inner,
            shared,
            slot,
        }
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

impl<S, Req> Service<Req> for AttemptMetrics<S>
where
    S: Service<Req>,
    S::Error: IntoToolError,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = AttemptFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline(always)]
    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &self.shared;
        let tool = self.slot.unwrap_or_else(|| shared.tools.index(label(&req)));
        let state = req.call_state();
        let attempt = state.map_or(1, |s| s.attempt());
        if attempt > 1 {
            shared
                .retries(tool, state.and_then(|s| s.retry_reason()))
                .increment(1);
        }
        let span = if shared.spans {
            tracing::info_span!(
                target: "toolshield",
                "tool_attempt",
                attempt,
                outcome = Empty,
                error_code = Empty,
            )
        } else {
            Span::none()
        };
        let future = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        AttemptFuture::new(future, tool, span, Arc::clone(shared))
    }
}
