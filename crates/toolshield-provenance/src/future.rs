//! [`ResponseFuture`]: stamps the result when the inner future finishes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use toolshield_core::time;
use toolshield_core::IntoToolError;
use toolshield_core::{
    payload_digest, utc_at, ErrorKind, Progress, Provenance, ToolError, ToolResponse,
};
use uuid::Uuid;

/// The names a call's provenance is stamped with: its tool, and the source configured
/// for it (`None`: the tool is its own source). Given to the response, not cloned again.
pub(crate) struct Names {
    pub(crate) tool: Arc<str>,
    pub(crate) source: Option<Arc<str>>,
}

impl Names {
    /// The tool and its source, the source a second reference on the tool when none is
    /// configured.
    fn into_pair(self) -> (Arc<str>, Arc<str>) {
        let source = self.source.unwrap_or_else(|| Arc::clone(&self.tool));
        (self.tool, source)
    }
}

pin_project! {
    /// The future of [`Provenance`](crate::Provenance).
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        start: Instant,
        // Taken when the result is stamped.
        names: Option<Names>,
        trace_id: Option<Arc<str>>,
        execution_id: Uuid,
        progress: Option<Progress>,
        digest: bool,
    }
}

impl<F> ResponseFuture<F> {
    #[inline(always)]
    pub(crate) fn new(
        inner: F,
        start: Instant,
        names: Names,
        trace_id: Option<Arc<str>>,
        execution_id: Uuid,
        progress: Option<Progress>,
        digest: bool,
    ) -> Self {
        ResponseFuture {
            inner,
            start,
            names: Some(names),
            trace_id,
            execution_id,
            progress,
            digest,
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("tool", &self.names.as_ref().map(|n| &n.tool))
            .finish_non_exhaustive()
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolResponse, E>>,
    E: IntoToolError,
{
    type Output = Result<ToolResponse, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let Some(names) = this.names.take() else {
            return Poll::Ready(Err(ToolError::internal(
                "provenance future polled after completion",
            )));
        };
        // The one clock read on the way out: the duration (which the metrics layer outside
        // reads off the response) and the wall-clock stamp (derived from it).
        let end = time::now();
        let elapsed = end.saturating_duration_since(*this.start);
        Poll::Ready(match result {
            Ok(mut resp) => {
                stamp(
                    &mut resp,
                    (end, elapsed),
                    names,
                    this.trace_id,
                    *this.execution_id,
                    *this.digest,
                );
                if let Some(progress) = this.progress.as_ref() {
                    stamp_progress(&mut resp, progress);
                }
                Ok(resp)
            }
            Err(e) => {
                let e: ToolError = e.into_tool_error();
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
                    let (tool, source) = names.into_pair();
                    e.with_provenance(tool, source)
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
/// `fetched_at`, source and execution id, but names this call's trace (or none).
fn stamp(
    resp: &mut ToolResponse,
    (end, elapsed): (Instant, Duration),
    names: Names,
    trace_id: &Option<Arc<str>>,
    execution_id: Uuid,
    digest: bool,
) {
    let digest = if digest && resp.provenance.response_digest.is_none() {
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
    // What the tool or a layer inside named stays; the names fill in the rest, moved in
    // (a second reference on the tool only when it is its own source and both are blank).
    match (p.tool.is_none(), p.source.is_none()) {
        (true, true) => {
            let (tool, source) = names.into_pair();
            p.tool = Some(tool);
            p.source = Some(source);
        }
        (true, false) => p.tool = Some(names.tool),
        (false, true) => p.source = Some(names.source.unwrap_or(names.tool)),
        (false, false) => {}
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
    // The trace is this call's. A result served again (a cache hit, a replay) was
    // recorded in another caller's trace: that trace id is never handed to this caller.
    if p.trace_id.is_none() || p.cache_hit || p.replayed {
        p.trace_id.clone_from(trace_id);
    }
    p.response_digest = digest;
    p.duration = Some(elapsed);
}
