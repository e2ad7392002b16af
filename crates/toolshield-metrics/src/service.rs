//! [`Metrics`] and [`AttemptMetrics`]: wrap the inner service.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use toolshield_core::{CallKind, ShieldRequest, ShieldResponse, ToolError};
use tower_service::Service;
use tracing::field::Empty;
use tracing::Span;

use crate::future::{AttemptFuture, ResponseFuture};
use crate::handles::Shared;

/// Records the metrics and span of each logical call; built by
/// [`MetricsLayer`](crate::MetricsLayer).
#[derive(Debug, Clone)]
pub struct Metrics<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Metrics<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Metrics { inner, shared }
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

impl<S, Req> Service<Req> for Metrics<S>
where
    S: Service<Req>,
    S::Error: Into<ToolError>,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &self.shared;
        let tool = shared.tools.index(req.settings_name());
        let read_only = req.call_kind() == CallKind::ReadOnly;
        let span = if shared.spans {
            let meta = req.request_meta();
            tracing::info_span!(
                target: "toolshield",
                "tool_execution",
                tool = req.tool(),
                trace_id = meta.and_then(|m| m.trace_id.as_deref()),
                run_id = meta.and_then(|m| m.run_id.as_deref()),
                attempts = Empty,
                outcome = Empty,
                cache_hit = Empty,
                error_code = Empty,
            )
        } else {
            Span::none()
        };
        let start = Instant::now();
        let future = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        ResponseFuture::new(future, start, tool, read_only, span, Arc::clone(shared))
    }
}

/// Records the metrics and span of each attempt; built by
/// [`AttemptMetricsLayer`](crate::AttemptMetricsLayer).
#[derive(Debug, Clone)]
pub struct AttemptMetrics<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> AttemptMetrics<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        AttemptMetrics { inner, shared }
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
    S::Error: Into<ToolError>,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = AttemptFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &self.shared;
        let tool = shared.tools.index(req.settings_name());
        let attempt = req.attempt();
        if attempt > 1 {
            shared.retries(tool, req.retry_reason()).increment(1);
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
