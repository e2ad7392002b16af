//! [`Provenance`]: wraps the inner service.

use std::sync::Arc;
use std::task::{Context, Poll};

use toolshield_core::time;
use toolshield_core::IntoToolError;
use toolshield_core::{ShieldRequest, ToolError, ToolRequest, ToolResponse};
use tower_service::Service;

use crate::future::{Names, ResponseFuture};
use crate::layer::Settings;

/// Stamps provenance on the responses of the inner service; built by
/// [`ProvenanceLayer`](crate::ProvenanceLayer).
#[derive(Debug, Clone)]
pub struct Provenance<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> Provenance<S> {
    pub(crate) fn new(inner: S, settings: Arc<Settings>) -> Self {
        Provenance { inner, settings }
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

impl<S> Service<ToolRequest> for Provenance<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: IntoToolError,
{
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline(always)]
    fn call(&mut self, mut req: ToolRequest) -> Self::Future {
        // The call's entry stamp: read here only when no layer outside stamped it.
        let start = time::enter(&mut req);
        // Progress is counted for the response: the caller's own count if it observes the
        // call, else a count started here (one small allocation per call).
        let progress = req.call_state_mut().map(|state| {
            let progress = state.progress_mut();
            progress.observe();
            progress.clone()
        });
        let tool = Arc::clone(req.tool_arc());
        // The configured source, if any, resolved now: the future holds what it stamps,
        // not the layer's settings (no shared count written per call).
        let source = self.settings.source_for(&tool).cloned();
        let trace_id = req.meta().trace_id.clone();
        let execution_id = req.execution_id();
        ResponseFuture::new(
            self.inner.call(req),
            start,
            Names { tool, source },
            trace_id,
            execution_id,
            progress,
            self.settings.digest,
        )
    }
}
