//! [`ResponseFuture`] of the idempotency service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use toolshield_core::{ToolError, ToolResponse};

pub(crate) type GuardedFuture =
    Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send + 'static>>;

pin_project! {
    /// The future of [`Idempotency`](crate::Idempotency): the inner future untouched for
    /// calls the layer does not guard, or the claim / call / record lifecycle (one boxed
    /// future: it awaits the store, which is I/O anyway).
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Passthrough { #[pin] fut: F },
        Guarded { fut: GuardedFuture },
        Ready { result: Option<Result<ToolResponse, ToolError>> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn passthrough(fut: F) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { fut },
        }
    }

    pub(crate) fn guarded(fut: GuardedFuture) -> Self {
        ResponseFuture {
            kind: Kind::Guarded { fut },
        }
    }

    pub(crate) fn ready(result: Result<ToolResponse, ToolError>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                result: Some(result),
            },
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Passthrough { .. } => "passthrough",
            Kind::Guarded { .. } => "guarded",
            Kind::Ready { .. } => "ready",
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
            KindProj::Guarded { fut } => fut.as_mut().poll(cx),
            KindProj::Ready { result } => Poll::Ready(
                result
                    .take()
                    .unwrap_or_else(|| Err(ToolError::internal("future polled after completion"))),
            ),
        }
    }
}
