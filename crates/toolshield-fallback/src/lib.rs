//! Ordered fallback chains.
//!
//! When the primary service fails in a way a fallback can fix (by default: its breaker is
//! open, or its retries are exhausted on a retriable error), the call is handed to the
//! next tier: a mirror, a cheaper model, a cached snapshot service. Each tier has its own
//! predicate (which failures hand over to it) and its own shield (wrap the tier's service
//! in whatever layers it needs before adding it). Provenance records which tier answered
//! (`provenance.tier`). When every tier fails, the error lists each tier's error, and an
//! optional escalation hook lets the application decide: retry the tiers, skip with a
//! substitute result, or abort. A retried round asks the tiers' predicates again and never
//! sends a mutation back to a tier it may have run on; a hook that panics ends the call
//! with `INTERNAL`.
//!
//! Each hand-over is a `tracing` event (tool, from, to, code) and is counted in
//! [`FallbackStats`], which the metrics layer exports.
//!
//! In the default stack it sits inside idempotency (a mutation keeps one claim whichever
//! tier runs it) and outside retry (a tier takes over only after the primary's retries):
//!
//! ```text
//! metrics > provenance > cancel > deadline > validate > cache > idempotency > FALLBACK
//!         > retry > breaker > attempt timeout > tool
//! ```
//!
//! The primary path makes no allocation; the tiers are boxed services (heterogeneous
//! types), so a hand-over allocates, which only happens on failure.
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//! use tower::{service_fn, Layer, ServiceExt};
//! use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
//! use toolshield_fallback::FallbackLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let primary = service_fn(|_req: ToolRequest| async {
//!     Err::<ToolResponse, _>(ToolError::new(ErrorKind::CircuitOpen, "circuit open for tool `llm`"))
//! });
//! let cheaper = service_fn(|_req: ToolRequest| async {
//!     Ok::<_, ToolError>(ToolResponse::new(json!("answer from the small model")))
//! });
//! let svc = FallbackLayer::new().tier("small-model", cheaper).layer(primary);
//! let res = svc.oneshot(ToolRequest::new("llm", json!({"prompt": "hi"}))).await.unwrap();
//! assert_eq!(res.provenance.tier.as_deref(), Some("small-model"));
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolService};
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type TierService = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;
type Predicate = Arc<dyn Fn(&ToolRequest, &ToolError) -> bool + Send + Sync>;
type EscalateFn = Arc<dyn Fn(FallbackFailure) -> BoxFuture<Escalation> + Send + Sync>;

/// The default hand-over rule.
///
/// - `CIRCUIT_OPEN` always hands over: the failing service never ran.
/// - For `ReadOnly` and `Idempotent` calls, any retriable error hands over too (the
///   fallback layer sits outside retry, so a retriable error reaching it means the
///   retries are exhausted).
/// - A `Mutating` call hands over only on `CIRCUIT_OPEN`: after a timeout or a lost
///   connection it may have happened, and running it on another tier could do it twice.
/// - Everything else (invalid input, not found, unauthorized, cancelled, idempotency
///   conflicts, outcome unknown) stays with the caller: another tier would fail the same
///   way, or must not run.
pub fn default_hand_over(req: &ToolRequest, error: &ToolError) -> bool {
    match error.kind() {
        ErrorKind::CircuitOpen => true,
        kind if kind.is_retriable() => req.call_kind() != CallKind::Mutating,
        _ => false,
    }
}

/// What the application decides when every tier failed.
#[derive(Debug)]
pub enum Escalation {
    /// Return the combined error.
    Abort,
    /// Return this response instead (marked with tier `escalation`).
    Skip(ToolResponse),
    /// Run the fallback tiers once more (the primary already spent its retries).
    ///
    /// The round starts as a hand-over from the last error: each tier's predicate is
    /// asked again, in order. For a `Mutating` call, a tier that failed with anything but
    /// `CIRCUIT_OPEN` (a `TIMEOUT`, an `OUTCOME_UNKNOWN`: it may have run) is never sent
    /// the call again.
    Retry,
    /// Run the fallback tiers once more with a changed request, under the same rules as
    /// [`Retry`](Escalation::Retry) (the call counts as `Mutating` if either request is).
    Modify(ToolRequest),
}

/// Every tier's failure, handed to the escalation hook.
#[derive(Debug, Clone)]
pub struct FallbackFailure {
    /// The request of the last round.
    pub request: ToolRequest,
    /// `(tier, error)` for the primary (named `primary`) and each tier that ran.
    pub errors: Vec<(Arc<str>, ToolError)>,
    /// How many escalations already happened for this call.
    pub escalations: u32,
}

impl FallbackFailure {
    /// The combined error: the kind and wait of the last tier that ran, and a message
    /// listing every tier's error. The source is the last tier's error.
    pub fn to_error(&self) -> ToolError {
        combine(&self.errors)
    }
}

/// The combined error of a failed chain (see [`FallbackFailure::to_error`]).
fn combine(errors: &[(Arc<str>, ToolError)]) -> ToolError {
    let listed: Vec<String> = errors
        .iter()
        .map(|(tier, e)| format!("{tier}: {e}"))
        .collect();
    let Some((_, last)) = errors.last() else {
        return ToolError::internal("fallback chain failed without an error");
    };
    let message = format!("every tier failed ({})", listed.join("; "));
    let retry_after: Option<Duration> = errors.iter().filter_map(|(_, e)| e.retry_after()).min();
    let mut error = ToolError::new(last.kind(), message)
        .with_attempts(last.attempts())
        .with_source(last.clone());
    if let Some(wait) = retry_after {
        error = error.with_retry_after(wait);
    }
    error
}

/// Hand-overs counted per tier, shared by every service built from one [`FallbackLayer`];
/// `toolshield-metrics` exports them as `tool_fallback_handovers_total{tool,tier}`.
#[derive(Debug, Default)]
pub struct FallbackStats {
    tiers: Vec<(Arc<str>, AtomicU64)>,
    exhausted: AtomicU64,
    escalations: AtomicU64,
}

impl FallbackStats {
    /// `(tier, calls handed to it)`, in chain order.
    pub fn hand_overs(&self) -> Vec<(Arc<str>, u64)> {
        self.tiers
            .iter()
            .map(|(name, n)| (name.clone(), n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Calls where every tier failed.
    pub fn exhausted(&self) -> u64 {
        self.exhausted.load(Ordering::Relaxed)
    }

    /// Calls handed to the escalation hook.
    pub fn escalations(&self) -> u64 {
        self.escalations.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct Tier {
    name: Arc<str>,
    service: TierService,
    predicate: Predicate,
}

/// Configures a fallback chain; [`Layer::layer`] puts it around the primary service.
/// Every service built from one layer shares its [`FallbackStats`].
#[derive(Clone)]
pub struct FallbackLayer {
    shared: Arc<Shared>,
}

impl Default for FallbackLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for FallbackLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.shared.tiers.iter().map(|t| &*t.name).collect();
        f.debug_struct("FallbackLayer")
            .field("tiers", &names)
            .field("escalate", &self.shared.escalate.is_some())
            .field("max_escalations", &self.shared.max_escalations)
            .finish()
    }
}

impl FallbackLayer {
    /// An empty chain (a pass-through until tiers are added).
    pub fn new() -> Self {
        Self::from_parts(Vec::new(), None, 1)
    }

    fn from_parts(tiers: Vec<Tier>, escalate: Option<EscalateFn>, max_escalations: u32) -> Self {
        let stats = Arc::new(FallbackStats {
            tiers: tiers
                .iter()
                .map(|t| (t.name.clone(), AtomicU64::new(0)))
                .collect(),
            ..FallbackStats::default()
        });
        FallbackLayer {
            shared: Arc::new(Shared {
                tiers,
                escalate,
                max_escalations,
                stats,
            }),
        }
    }

    /// A copy of this configuration changed by `f` (with fresh counters: the tiers may
    /// have changed).
    fn rebuild(self, f: impl FnOnce(&mut Vec<Tier>, &mut Option<EscalateFn>, &mut u32)) -> Self {
        let mut tiers = self.shared.tiers.clone();
        let mut escalate = self.shared.escalate.clone();
        let mut max = self.shared.max_escalations;
        f(&mut tiers, &mut escalate, &mut max);
        Self::from_parts(tiers, escalate, max)
    }

    /// The hand-over counters shared by every service built from this layer.
    pub fn stats(&self) -> Arc<FallbackStats> {
        self.shared.stats.clone()
    }

    /// Adds a tier with the [`default_hand_over`] rule.
    pub fn tier<S>(self, name: impl Into<Arc<str>>, service: S) -> Self
    where
        S: ToolService,
    {
        self.tier_when(name, service, default_hand_over)
    }

    /// Adds a tier that takes over when `predicate(request, error)` holds for the error
    /// of the tier before it.
    pub fn tier_when<S, P>(self, name: impl Into<Arc<str>>, service: S, predicate: P) -> Self
    where
        S: ToolService,
        P: Fn(&ToolRequest, &ToolError) -> bool + Send + Sync + 'static,
    {
        let tier = Tier {
            name: name.into(),
            service: BoxCloneSyncService::new(service),
            predicate: Arc::new(predicate),
        };
        self.rebuild(|tiers, _, _| tiers.push(tier))
    }

    /// The last resort when every tier failed: the hook decides to abort, skip with a
    /// substitute result, or retry the tiers (at most `max_escalations` times per call,
    /// default 1; see [`max_escalations`](Self::max_escalations)).
    pub fn escalate<F, Fut>(self, hook: F) -> Self
    where
        F: Fn(FallbackFailure) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Escalation> + Send + 'static,
    {
        let hook: EscalateFn = Arc::new(move |failure| Box::pin(hook(failure)));
        self.rebuild(|_, escalate, _| *escalate = Some(hook))
    }

    /// How many times one call may be escalated and re-run (default 1). Past it, the
    /// combined error is returned.
    pub fn max_escalations(self, n: u32) -> Self {
        self.rebuild(|_, _, max| *max = n)
    }
}

impl<S> Layer<S> for FallbackLayer {
    type Service = Fallback<S>;

    fn layer(&self, inner: S) -> Fallback<S> {
        Fallback {
            inner,
            shared: self.shared.clone(),
        }
    }
}

struct Shared {
    tiers: Vec<Tier>,
    escalate: Option<EscalateFn>,
    max_escalations: u32,
    stats: Arc<FallbackStats>,
}

/// Calls the primary service and, when it fails in a way a tier accepts, the tiers in
/// order.
#[derive(Clone)]
pub struct Fallback<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for Fallback<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("inner", &self.inner)
            .field("tiers", &self.shared.tiers.len())
            .finish()
    }
}

impl<S> Fallback<S> {
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

impl<S> Service<ToolRequest> for Fallback<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: Into<ToolError>,
{
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        // Only keep a copy of the request (a few refcounts) when there is somewhere to go.
        let keep = (!self.shared.tiers.is_empty()).then(|| req.clone());
        let mutating = req.call_kind() == CallKind::Mutating;
        ResponseFuture {
            state: State::Primary {
                fut: self.inner.call(req),
            },
            req: keep,
            shared: self.shared.clone(),
            errors: Vec::new(),
            escalations: 0,
            ran: Vec::new(),
            mutating,
        }
    }
}

pin_project! {
    /// The future of [`Fallback`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        req: Option<ToolRequest>,
        shared: Arc<Shared>,
        errors: Vec<(Arc<str>, ToolError)>,
        escalations: u32,
        // Tiers that failed with an error after which they may have run (anything but
        // CIRCUIT_OPEN): a mutation is never sent to them again.
        ran: Vec<usize>,
        // Whether any request of this call was `Mutating`.
        mutating: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Primary { #[pin] fut: F },
        Tier { fut: BoxFuture<Result<ToolResponse, ToolError>>, index: usize },
        Escalating { fut: BoxFuture<Escalation> },
        Done,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("errors", &self.errors.len())
            .finish_non_exhaustive()
    }
}

const PRIMARY: &str = "primary";

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolResponse, E>>,
    E: Into<ToolError>,
{
    type Output = Result<ToolResponse, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            // `from` is the index of the next tier to consider after a failure.
            let (failed_at, error, from) = match this.state.as_mut().project() {
                StateProj::Primary { fut } => match fut.poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(res)) => {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(res));
                    }
                    Poll::Ready(Err(e)) => (Arc::<str>::from(PRIMARY), e.into(), 0),
                },
                StateProj::Tier { fut, index } => match fut.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(mut res)) => {
                        res.provenance.tier = Some(this.shared.tiers[*index].name.clone());
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(res));
                    }
                    Poll::Ready(Err(e)) => {
                        if e.kind() != ErrorKind::CircuitOpen {
                            this.ran.push(*index);
                        }
                        (this.shared.tiers[*index].name.clone(), e, *index + 1)
                    }
                },
                StateProj::Escalating { fut } => {
                    // The hook is application code: a panic in it ends this call with
                    // INTERNAL instead of unwinding through the stack.
                    let polled = panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)));
                    let decision = match polled {
                        Ok(Poll::Pending) => return Poll::Pending,
                        Ok(Poll::Ready(d)) => d,
                        Err(payload) => {
                            let error = hook_panicked(&payload, this.errors);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                    };
                    *this.escalations += 1;
                    match decision {
                        Escalation::Abort => {
                            let error = combine(this.errors);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                        Escalation::Skip(mut res) => {
                            res.provenance.tier = Some(Arc::from("escalation"));
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(res));
                        }
                        Escalation::Retry => {}
                        Escalation::Modify(req) => {
                            *this.mutating |= req.call_kind() == CallKind::Mutating;
                            *this.req = Some(req);
                        }
                    }
                    // A new round, as a hand-over from the last error: the predicates
                    // decide again, and a mutation never goes back to a tier it may have
                    // run on.
                    let Some((last_tier, last_error)) = this.errors.last() else {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(ToolError::internal(
                            "fallback escalated without an error",
                        )));
                    };
                    let skip: &[usize] = if *this.mutating { this.ran } else { &[] };
                    match start_tier(
                        this.shared,
                        this.req,
                        0,
                        Some(last_tier),
                        Some(last_error),
                        skip,
                    ) {
                        Some(next) => {
                            this.errors.clear();
                            this.state.set(next);
                            continue;
                        }
                        None => {
                            // No tier may take it: the last round's errors stand.
                            let error = combine(this.errors);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                    }
                }
                StateProj::Done => {
                    return Poll::Ready(Err(ToolError::internal(
                        "fallback future polled after completion",
                    )))
                }
            };

            let skip: &[usize] = if *this.mutating { this.ran } else { &[] };
            let next = start_tier(
                this.shared,
                this.req,
                from,
                Some(&failed_at),
                Some(&error),
                skip,
            );
            this.errors.push((failed_at, error));
            if let Some(next) = next {
                this.state.set(next);
                continue;
            }

            // No tier takes the primary's error: it goes back as it was.
            if this.errors.len() == 1 && from == 0 && *this.escalations == 0 {
                let (_, error) = this.errors.pop().unwrap_or_else(|| {
                    (
                        Arc::from(PRIMARY),
                        ToolError::internal("fallback lost its error"),
                    )
                });
                this.state.set(State::Done);
                return Poll::Ready(Err(error));
            }

            this.shared.stats.exhausted.fetch_add(1, Ordering::Relaxed);
            if let (Some(hook), Some(req)) = (&this.shared.escalate, this.req.as_ref()) {
                if *this.escalations < this.shared.max_escalations {
                    this.shared
                        .stats
                        .escalations
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        target: "toolshield::fallback",
                        tool = req.tool(),
                        tiers = this.errors.len(),
                        "every tier failed; escalating"
                    );
                    let failure = FallbackFailure {
                        request: req.clone(),
                        errors: this.errors.clone(),
                        escalations: *this.escalations,
                    };
                    match panic::catch_unwind(AssertUnwindSafe(|| hook(failure))) {
                        Ok(fut) => {
                            this.state.set(State::Escalating { fut });
                            continue;
                        }
                        Err(payload) => {
                            let error = hook_panicked(&payload, this.errors);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                    }
                }
            }
            let error = combine(this.errors);
            this.state.set(State::Done);
            return Poll::Ready(Err(error));
        }
    }
}

/// The `INTERNAL` error of a panicking escalation hook; the tiers' errors are its source.
/// The panic text is logged, never put in the error (it may hold anything).
#[cold]
fn hook_panicked(
    payload: &Box<dyn std::any::Any + Send>,
    errors: &[(Arc<str>, ToolError)],
) -> ToolError {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string panic payload");
    tracing::error!(
        target: "toolshield::fallback",
        panic = text,
        "the fallback escalation hook panicked"
    );
    let error = ToolError::internal("the fallback escalation hook panicked");
    if errors.is_empty() {
        error
    } else {
        error.with_source(combine(errors))
    }
}

/// The first tier at or after `from`, not in `skip`, whose predicate accepts `error`,
/// already called.
fn start_tier<F>(
    shared: &Arc<Shared>,
    req: &Option<ToolRequest>,
    from: usize,
    failed_at: Option<&Arc<str>>,
    error: Option<&ToolError>,
    skip: &[usize],
) -> Option<State<F>> {
    let req = req.as_ref()?;
    let (index, tier) = shared
        .tiers
        .iter()
        .enumerate()
        .skip(from)
        .filter(|(i, _)| !skip.contains(i))
        .find(|(_, t)| error.is_none_or(|e| (t.predicate)(req, e)))?;
    if let (Some(from_tier), Some(e)) = (failed_at, error) {
        tracing::info!(
            target: "toolshield::fallback",
            tool = req.tool(),
            from = &**from_tier,
            to = &*tier.name,
            code = e.code(),
            "handing over to the next tier"
        );
    }
    shared.stats.tiers[index].1.fetch_add(1, Ordering::Relaxed);
    let fut = tier.service.clone().oneshot(req.clone());
    Some(State::Tier {
        fut: Box::pin(fut),
        index,
    })
}
