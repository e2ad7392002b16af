//! [`ResponseFuture`]: stamps the result when the inner future finishes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use toolshield_core::time;
use toolshield_core::{
    payload_digest, utc_at, ErrorKind, Progress, Provenance, ToolError, ToolResponse,
};
use uuid::Uuid;

use crate::layer::Settings;

pin_project! {
    /// The future of [`Provenance`](crate::Provenance).
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        start: Instant,
        tool: Arc<str>,
        trace_id: Option<Arc<str>>,
        execution_id: Uuid,
        progress: Option<Progress>,
        settings: Arc<Settings>,
    }
}

impl<F> ResponseFuture<F> {
    #[inline(always)]
    pub(crate) fn new(
        inner: F,
        start: Instant,
        tool: Arc<str>,
        trace_id: Option<Arc<str>>,
        execution_id: Uuid,
        progress: Option<Progress>,
        settings: Arc<Settings>,
    ) -> Self {
        ResponseFuture {
            inner,
            start,
            tool,
            trace_id,
            execution_id,
            progress,
            settings,
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("tool", &self.tool)
            .finish_non_exhaustive()
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolResponse, E>>,
    E: Into<ToolError>,
{
    type Output = Result<ToolResponse, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        // The one clock read on the way out: the duration (which the metrics layer outside
        // reads off the response) and the wall-clock stamp (derived from it).
        let end = time::now();
        let elapsed = end.saturating_duration_since(*this.start);
        Poll::Ready(match result {
            Ok(mut resp) => {
                stamp(
                    &mut resp,
                    (end, elapsed),
                    this.tool,
                    this.trace_id,
                    *this.execution_id,
                    this.settings,
                );
                if let Some(progress) = this.progress.as_ref() {
                    stamp_progress(&mut resp, progress);
                }
                Ok(resp)
            }
            Err(e) => {
                let e: ToolError = e.into();
                let attempts = match (e.attempts(), e.kind()) {
                    (0, ErrorKind::Cancelled) => 0,
                    (0, _) => 1,
                    (n, _) => n,
                };
                let e = e.with_attempts(attempts).with_elapsed(elapsed);
                // A layer inside (a fallback tier's own stack) that named the failure keeps
                // its name.
                Err(if e.provenance_tool().is_some() {
                    e
                } else {
                    e.with_provenance(Arc::clone(this.tool), this.settings.source_of(this.tool))
                })
            }
        })
    }
}

/// The progress of this call, unless the tool or a layer inside already wrote some.
fn stamp_progress(resp: &mut ToolResponse, progress: &Progress) {
    if resp.provenance.progress_reports != 0 || resp.provenance.progress_message.is_some() {
        return;
    }
    let reports = progress.reports();
    // No report, no message: the lock is taken (and the record written) only when there
    // was one.
    if reports > 0 {
        let p: &mut Provenance = &mut resp.provenance;
        p.progress_reports = reports;
        p.progress_message = progress.last_message();
    }
}

/// Fills in what the tool and the layers inside left blank, and the call's duration
/// (`elapsed`, which ended at `end`). A cache hit or a replay keeps its original
/// `fetched_at`, source and execution id.
fn stamp(
    resp: &mut ToolResponse,
    (end, elapsed): (Instant, Duration),
    tool: &Arc<str>,
    trace_id: &Option<Arc<str>>,
    execution_id: Uuid,
    settings: &Settings,
) {
    let digest = if settings.digest && resp.provenance.response_digest.is_none() {
        match payload_digest(&resp.output) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::debug!(target: "toolshield::provenance", code = e.code(), "output has no canonical form: no digest");
                None
            }
        }
    } else {
        resp.provenance.response_digest
    };
    // Boxed here, once, if nothing inside wrote to it yet.
    let p: &mut Provenance = &mut resp.provenance;
    if p.tool.is_none() {
        p.tool = Some(Arc::clone(tool));
    }
    if p.source.is_none() {
        p.source = Some(settings.source_of(tool));
    }
    if p.fetched_at.is_none() {
        p.fetched_at = Some(utc_at(end));
    }
    if p.attempts == 0 {
        p.attempts = 1;
    }
    if p.execution_id.is_none() {
        p.execution_id = Some(execution_id);
    }
    if p.trace_id.is_none() {
        p.trace_id.clone_from(trace_id);
    }
    p.response_digest = digest;
    p.duration = Some(elapsed);
}
