//! [`AttemptProvenanceLayer`]: records which attempt produced a response.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;
use uuid::Uuid;

use toolshield_core::{ToolRequest, ToolResponse};

/// Records on each response the execution id of the attempt that produced it, unless the
/// tool or a layer inside already named one.
///
/// A retry gives each attempt an execution id of its own
/// ([`ToolRequest::begin_attempt`]), so the id the [`ProvenanceLayer`](crate::ProvenanceLayer)
/// sees as the call enters is the first attempt's. Placed below the retry (and the hedge),
/// this layer sees the attempt that answered, and the response's `execution_id` names it:
/// the id the tool saw, and logged, when it produced the data. The shield puts it right
/// above the tool in every stack it builds; compose it the same way by hand:
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

impl<S> Service<ToolRequest> for AttemptProvenance<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
{
    type Response = ToolResponse;
    type Error = S::Error;
    type Future = AttemptFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)]
    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let execution_id = req.execution_id();
        AttemptFuture {
            inner: self.inner.call(req),
            execution_id,
        }
    }
}

pin_project! {
    /// The future of [`AttemptProvenance`].
    pub struct AttemptFuture<F> {
        #[pin]
        inner: F,
        execution_id: Uuid,
    }
}

impl<F> std::fmt::Debug for AttemptFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptFuture")
            .field("execution_id", &self.execution_id)
            .finish_non_exhaustive()
    }
}

impl<F, E> Future for AttemptFuture<F>
where
    F: Future<Output = Result<ToolResponse, E>>,
{
    type Output = Result<ToolResponse, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut result = ready!(this.inner.poll(cx));
        if let Ok(resp) = &mut result {
            if resp.provenance.execution_id.is_none() {
                resp.provenance.execution_id = Some(*this.execution_id);
            }
        }
        Poll::Ready(result)
    }
}
