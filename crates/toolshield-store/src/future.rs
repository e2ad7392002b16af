//! [`LayerFuture`]: the response future of a layer that consults a store.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use toolshield_contract::IntoToolError;
use toolshield_contract::ToolError;

/// The boxed path of a [`LayerFuture`].
pub type BoxedPath<R> = Pin<Box<dyn Future<Output = Result<R, ToolError>> + Send + 'static>>;

pin_project! {
    /// The response future of a store-backed layer (the cache, idempotency): the inner
    /// future untouched for calls the layer lets through, an answer known at once, or
    /// the store path as one boxed future (it awaits the store, which is I/O anyway, so
    /// only calls that take it pay for the box).
    ///
    /// ```
    /// use toolshield_contract::{ErrorKind, ToolError};
    /// use toolshield_store::LayerFuture;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let through: LayerFuture<_, u32> = LayerFuture::passthrough(async { Ok::<u32, ToolError>(1) });
    /// assert_eq!(through.await.unwrap(), 1);
    /// let boxed: LayerFuture<std::future::Ready<Result<u32, ToolError>>, u32> =
    ///     LayerFuture::boxed(Box::pin(async { Ok(2) }));
    /// assert_eq!(boxed.await.unwrap(), 2);
    /// let rejected: LayerFuture<std::future::Ready<Result<u32, ToolError>>, u32> =
    ///     LayerFuture::ready(Err(ToolError::new(ErrorKind::InvalidInput, "bad key")));
    /// assert_eq!(rejected.await.unwrap_err().kind(), ErrorKind::InvalidInput);
    /// # }
    /// ```
    pub struct LayerFuture<F, R> {
        #[pin]
        kind: Kind<F, R>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, R> {
        Passthrough { #[pin] fut: F },
        Boxed { fut: BoxedPath<R> },
        Ready { result: Option<Result<R, ToolError>> },
    }
}

impl<F, R> LayerFuture<F, R> {
    /// The inner service's future, its error converted into a [`ToolError`].
    #[inline]
    pub fn passthrough(fut: F) -> Self {
        LayerFuture {
            kind: Kind::Passthrough { fut },
        }
    }

    /// The layer's own path through the store.
    pub fn boxed(fut: BoxedPath<R>) -> Self {
        LayerFuture {
            kind: Kind::Boxed { fut },
        }
    }

    /// An answer known when the call was made (a request the layer rejects).
    #[inline]
    pub fn ready(result: Result<R, ToolError>) -> Self {
        LayerFuture {
            kind: Kind::Ready {
                result: Some(result),
            },
        }
    }
}

impl<F, R> fmt::Debug for LayerFuture<F, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Passthrough { .. } => "passthrough",
            Kind::Boxed { .. } => "boxed",
            Kind::Ready { .. } => "ready",
        };
        f.debug_struct("LayerFuture").field("kind", &kind).finish()
    }
}

impl<F, R, E> Future for LayerFuture<F, R>
where
    F: Future<Output = Result<R, E>>,
    E: IntoToolError,
{
    type Output = Result<R, ToolError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { fut } => fut.poll(cx).map_err(IntoToolError::into_tool_error),
            KindProj::Boxed { fut } => fut.as_mut().poll(cx),
            KindProj::Ready { result } => Poll::Ready(
                result
                    .take()
                    .unwrap_or_else(|| Err(ToolError::internal("future polled after completion"))),
            ),
        }
    }
}
