//! [`ResponseFuture`] of the cache service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use toolshield_core::{ToolError, ToolResponse};

pub(crate) type CachedFuture =
    Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send + 'static>>;

pin_project! {
    /// The future of [`Cache`](crate::Cache): the inner future untouched for calls that
    /// are not cached, or the lookup / single-flight path (one boxed future: it awaits the
    /// store).
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Passthrough { #[pin] fut: F },
        Cached { fut: CachedFuture },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn passthrough(fut: F) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { fut },
        }
    }

    pub(crate) fn cached(fut: CachedFuture) -> Self {
        ResponseFuture {
            kind: Kind::Cached { fut },
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Passthrough { .. } => "passthrough",
            Kind::Cached { .. } => "cached",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolResponse, E>>,
    E: Into<ToolError>,
{
    type Output = Result<ToolResponse, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { fut } => fut.poll(cx).map_err(Into::into),
            KindProj::Cached { fut } => fut.as_mut().poll(cx),
        }
    }
}
