//! [`AttemptProvenanceLayer`]: records which attempt produced a response, and tells the
//! call's claim when an attempt reaches the tool.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use toolshield_core::{ShieldRequest, ShieldResponse};

/// Records on each response the execution id of the attempt that produced it, unless the
/// tool or a layer inside already named one
/// ([`ShieldRequest::attempt_id`], [`ShieldResponse::name_attempt`]: for any request
/// and response types that have them; a type without attempt ids passes through).
///
/// A retry gives each attempt an execution id of its own
/// ([`ToolRequest::begin_attempt`](toolshield_core::ToolRequest::begin_attempt)), so the
/// id the [`ProvenanceLayer`](crate::ProvenanceLayer) sees as the call enters is the
/// first attempt's. Placed below the retry (and the hedge),
/// this layer sees the attempt that answered, and the response's `execution_id` names it:
/// the id the tool saw, and logged, when it produced the data. The shield puts it right
/// above the tool in every stack it builds; compose it the same way by hand.
///
/// It also marks where an attempt reaches the tool: as it passes each attempt on, it
/// tells the call's claim, if a layer above holds one, that the work may have started
/// ([`CallState::mark_started`](toolshield_core::CallState::mark_started)). A
/// `toolshield_idempotency::IdempotencyLayer` told that the stack marks its attempts
/// (`with_attempt_marks`) then frees the key of a mutation dropped or
/// cancelled before any attempt got here (in a bulkhead's queue, waiting for a rate
/// limiter's turn) instead of keeping it `OUTCOME_UNKNOWN`:
///
/// ```
/// use serde_json::json;
/// use toolshield_core::{ToolError, ToolRequest, ToolResponse};
/// use toolshield_provenance::{AttemptProvenanceLayer, ProvenanceLayer};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// # tokio_test_block_on(async {
/// let svc = ServiceBuilder::new()
///     .layer(ProvenanceLayer::new())
///     // .layer(retry)
///     .layer(AttemptProvenanceLayer::new())
///     .service(service_fn(|req: ToolRequest| async move {
///         Ok::<_, ToolError>(ToolResponse::new(json!(req.execution_id().to_string())))
///     }));
/// let res = svc.oneshot(ToolRequest::new("t", json!({}))).await.unwrap();
/// assert_eq!(
///     res.provenance.execution_id.map(|id| id.to_string()),
///     res.output.as_str().map(str::to_owned),
/// );
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct AttemptProvenanceLayer {
    _priv: (),
}

impl AttemptProvenanceLayer {
    /// A new layer. It has no configuration.
    #[must_use]
    pub fn new() -> Self {
        AttemptProvenanceLayer { _priv: () }
    }
}

impl<S> Layer<S> for AttemptProvenanceLayer {
    type Service = AttemptProvenance<S>;

    fn layer(&self, inner: S) -> AttemptProvenance<S> {
        AttemptProvenance { inner }
    }
}

/// The service of [`AttemptProvenanceLayer`].
#[derive(Debug, Clone)]
pub struct AttemptProvenance<S> {
    inner: S,
}

impl<S> AttemptProvenance<S> {
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

impl<S, Req> Service<Req> for AttemptProvenance<S>
where
    S: Service<Req>,
    S::Response: ShieldResponse,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = AttemptFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)]
    fn call(&mut self, req: Req) -> Self::Future {
        let attempt_id = req.attempt_id();
        // The attempt reaches the tool here: a claim on the call learns that its work may
        // have started.
        if let Some(state) = req.call_state() {
            state.mark_started();
        }
        AttemptFuture {
            inner: self.inner.call(req),
            attempt_id,
        }
    }
}

pin_project! {
    /// The future of [`AttemptProvenance`].
    pub struct AttemptFuture<F> {
        #[pin]
        inner: F,
        attempt_id: Option<[u8; 16]>,
    }
}

impl<F> std::fmt::Debug for AttemptFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptFuture")
            .field("names_attempt", &self.attempt_id.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, Res, E> Future for AttemptFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    Res: ShieldResponse,
{
    type Output = Result<Res, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut result = ready!(this.inner.poll(cx));
        if let (Ok(res), Some(id)) = (&mut result, *this.attempt_id) {
            res.name_attempt(id);
        }
        Poll::Ready(result)
    }
}
