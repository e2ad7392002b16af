//! The futures of [`Metrics`](crate::Metrics) and [`AttemptMetrics`](crate::AttemptMetrics).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use toolshield_core::{ErrorKind, ShieldResponse, ToolError};
use tracing::Span;

use crate::handles::Shared;
use crate::names::Status;

/// What a finished call or attempt was, read once from its result.
struct Facts {
    status: Status,
    failure: Option<ErrorKind>,
    attempts: u32,
    cache_hit: bool,
    replayed: bool,
    unrecorded: bool,
    slow: bool,
}

fn facts<Res: ShieldResponse>(result: &Result<Res, ToolError>) -> Facts {
    match result {
        Ok(res) => {
            let failure = res.in_band_failure().map(|f| f.kind);
            let prov = res.provenance();
            Facts {
                status: failure.map_or(Status::Success, Status::of_kind),
                failure,
                attempts: prov.map_or(1, |p| p.attempts.max(1)),
                cache_hit: prov.is_some_and(|p| p.cache_hit),
                replayed: prov.is_some_and(|p| p.replayed),
                unrecorded: prov.is_some_and(|p| p.unrecorded),
                slow: res.slow_call().is_some() || prov.is_some_and(|p| p.slow),
            }
        }
        Err(e) => Facts {
            status: Status::of_kind(e.kind()),
            failure: Some(e.kind()),
            attempts: e.attempts(),
            cache_hit: false,
            replayed: false,
            unrecorded: false,
            slow: false,
        },
    }
}

pin_project! {
    /// The future of [`Metrics`](crate::Metrics): records when the call finishes.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        start: Instant,
        tool: usize,
        read_only: bool,
        span: Span,
        shared: Arc<Shared>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(
        inner: F,
        start: Instant,
        tool: usize,
        read_only: bool,
        span: Span,
        shared: Arc<Shared>,
    ) -> Self {
        ResponseFuture {
            inner,
            start,
            tool,
            read_only,
            span,
            shared,
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

impl<F, Res, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<ToolError>,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.span.enter();
            ready!(this.inner.poll(cx)).map_err(Into::into)
        };
        let elapsed = this.start.elapsed();
        let f = facts(&result);
        let (shared, tool) = (&**this.shared, *this.tool);

        shared.execution(tool, f.status).increment(1);
        shared
            .duration(tool, f.status)
            .record(elapsed.as_secs_f64());
        if let Some(kind) = f.failure {
            shared.errors(tool, kind).increment(1);
        }
        if f.slow {
            shared.slow(tool).increment(1);
        }
        if f.unrecorded {
            shared.unrecorded(tool).increment(1);
        }
        if f.cache_hit {
            shared.cache_hits(tool).increment(1);
        } else if f.replayed {
            shared.replays(tool).increment(1);
        } else if *this.read_only
            && shared.cache_misses
            && !matches!(
                f.failure,
                Some(ErrorKind::InvalidInput | ErrorKind::Cancelled)
            )
        {
            shared.cache_misses(tool).increment(1);
        }

        let span = &*this.span;
        if !span.is_disabled() {
            span.record("outcome", f.status.as_str());
            span.record("attempts", f.attempts);
            span.record("cache_hit", f.cache_hit);
            if let Some(kind) = f.failure {
                span.record("error_code", kind.code());
            }
            let _entered = span.enter();
            let duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
            match f.failure {
                None => tracing::debug!(
                    target: "toolshield",
                    outcome = f.status.as_str(),
                    attempts = f.attempts,
                    cache_hit = f.cache_hit,
                    replayed = f.replayed,
                    duration_ms,
                    "tool call finished"
                ),
                Some(kind) => tracing::info!(
                    target: "toolshield",
                    outcome = f.status.as_str(),
                    attempts = f.attempts,
                    error_code = kind.code(),
                    duration_ms,
                    "tool call failed"
                ),
            }
        }
        Poll::Ready(result)
    }
}

pin_project! {
    /// The future of [`AttemptMetrics`](crate::AttemptMetrics): records when the attempt
    /// finishes.
    pub struct AttemptFuture<F> {
        #[pin]
        inner: F,
        tool: usize,
        span: Span,
        shared: Arc<Shared>,
    }
}

impl<F> AttemptFuture<F> {
    pub(crate) fn new(inner: F, tool: usize, span: Span, shared: Arc<Shared>) -> Self {
        AttemptFuture {
            inner,
            tool,
            span,
            shared,
        }
    }
}

impl<F> std::fmt::Debug for AttemptFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptFuture")
            .field("tool", &self.tool)
            .finish_non_exhaustive()
    }
}

impl<F, Res, E> Future for AttemptFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<ToolError>,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.span.enter();
            ready!(this.inner.poll(cx)).map_err(Into::into)
        };
        let f = facts(&result);
        this.shared.attempts(*this.tool, f.status).increment(1);
        let span = &*this.span;
        if !span.is_disabled() {
            span.record("outcome", f.status.as_str());
            if let Some(kind) = f.failure {
                span.record("error_code", kind.code());
            }
        }
        Poll::Ready(result)
    }
}
