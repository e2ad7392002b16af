//! The futures of [`Metrics`](crate::Metrics) and [`AttemptMetrics`](crate::AttemptMetrics).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use toolshield_contract::time;
use toolshield_contract::IntoToolError;
use toolshield_contract::{ErrorKind, ShieldResponse, ToolError};
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
            Facts {
                status: failure.map_or(Status::Success, Status::of_kind),
                failure,
                attempts: res.attempts().map_or(1, |a| a.max(1)),
                cache_hit: res.cache_hit(),
                replayed: res.replayed(),
                unrecorded: res.unrecorded(),
                slow: res.is_slow(),
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
    /// The future of [`Metrics`](crate::Metrics): records when the call finishes, or,
    /// dropped before it finished, records the call as `cancelled` (code `CANCELLED`)
    /// with its duration.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        start: Instant,
        tool: usize,
        // A read-only call through a layer that counts cache misses: one that was not
        // answered by a cache (or a replay) counts as a miss.
        counts_miss: bool,
        span: Span,
        shared: Arc<Shared>,
        done: bool,
    }

    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.done {
                record_dropped_call(this.shared, *this.tool, *this.start, this.span);
            }
        }
    }
}

/// What a future dropped before it finished was: `CANCELLED` (the caller gave up: a
/// client disconnect, an outer timeout, a `select!`), or `INTERNAL` when it is dropped
/// while a panic of the inner future unwinds.
fn dropped_kind() -> ErrorKind {
    if std::thread::panicking() {
        ErrorKind::Internal
    } else {
        ErrorKind::Cancelled
    }
}

/// A call whose future was dropped before it finished: counted, timed and coded like a
/// call that failed with [`dropped_kind`].
fn record_dropped_call(shared: &Shared, tool: usize, start: Instant, span: &Span) {
    let elapsed = time::now().saturating_duration_since(start);
    let kind = dropped_kind();
    let status = Status::of_kind(kind);
    shared.execution(tool, status).increment(1);
    shared.duration(tool, status).record(elapsed.as_secs_f64());
    shared.errors(tool, kind).increment(1);
    if !span.is_disabled() {
        span.record("outcome", status.as_str());
        span.record("error_code", kind.code());
        let _entered = span.enter();
        let duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            target: "toolshield",
            outcome = status.as_str(),
            error_code = kind.code(),
            duration_ms,
            "tool call dropped before it finished"
        );
    }
}

impl<F> ResponseFuture<F> {
    #[inline(always)]
    pub(crate) fn new(
        inner: F,
        start: Instant,
        tool: usize,
        counts_miss: bool,
        span: Span,
        shared: Arc<Shared>,
    ) -> Self {
        ResponseFuture {
            inner,
            start,
            tool,
            counts_miss,
            span,
            shared,
            done: false,
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
    E: IntoToolError,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.span.enter();
            ready!(this.inner.poll(cx)).map_err(IntoToolError::into_tool_error)
        };
        *this.done = true;
        // The call's duration: as the provenance layer inside measured it from the same
        // entry stamp, else from a clock read here.
        let elapsed = match &result {
            Ok(res) => res.call_duration(),
            Err(_) => None,
        }
        .unwrap_or_else(|| time::now().saturating_duration_since(*this.start));
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
        } else if *this.counts_miss
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
    /// finishes, or, dropped before it finished, records an attempt with
    /// `outcome="cancelled"`.
    pub struct AttemptFuture<F> {
        #[pin]
        inner: F,
        tool: usize,
        span: Span,
        shared: Arc<Shared>,
        done: bool,
    }

    impl<F> PinnedDrop for AttemptFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.done {
                let kind = dropped_kind();
                let status = Status::of_kind(kind);
                this.shared.attempts(*this.tool, status).increment(1);
                if !this.span.is_disabled() {
                    this.span.record("outcome", status.as_str());
                    this.span.record("error_code", kind.code());
                }
            }
        }
    }
}

impl<F> AttemptFuture<F> {
    #[inline(always)]
    pub(crate) fn new(inner: F, tool: usize, span: Span, shared: Arc<Shared>) -> Self {
        AttemptFuture {
            inner,
            tool,
            span,
            shared,
            done: false,
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
    E: IntoToolError,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.span.enter();
            ready!(this.inner.poll(cx)).map_err(IntoToolError::into_tool_error)
        };
        *this.done = true;
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
