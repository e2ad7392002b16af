//! Requests buffered once so they can be sent again: `http::Request<Full<Bytes>>` is
//! `Clone`, which the retry layer needs.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::Request;
use http_body::Body;
use http_body_util::combinators::Collect;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use pin_project_lite::pin_project;
use toolshield_core::IntoToolError;
use toolshield_core::{BoxError, ErrorKind, ToolError};
use tower_layer::Layer;
use tower_service::Service;

/// The default limit on a buffered body: 4 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// A request whose body is in memory: cheap to clone (the bytes are shared).
pub type BufferedRequest = Request<Full<Bytes>>;

/// Maps an error met while collecting a body: over the limit is `INVALID_INPUT`, any
/// other body error `INTERNAL`; the error is kept as the source.
pub fn body_error(error: BoxError, limit: usize) -> ToolError {
    if error.is::<LengthLimitError>() {
        return ToolError::new(
            ErrorKind::InvalidInput,
            format!("http body exceeds the {limit} byte limit"),
        );
    }
    match error.downcast::<ToolError>() {
        Ok(e) => *e,
        Err(other) => ToolError::new(ErrorKind::Internal, format!("reading http body: {other}")),
    }
}

/// Collects a request's body once, up to `limit` bytes, into a clonable request.
pub async fn buffer_request<B>(req: Request<B>, limit: usize) -> Result<BufferedRequest, ToolError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let bytes = Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| body_error(e, limit))?
        .to_bytes();
    Ok(Request::from_parts(parts, Full::new(bytes)))
}

/// Buffers each request's body (up to a limit) before the inner service sees it, so the
/// layers inside (retry above all) can clone the request.
///
/// Not tower's `Buffer`, which queues requests in front of a service shared by many
/// callers: this one collects bodies. The two combine.
#[derive(Debug, Clone, Copy)]
pub struct BufferBodyLayer {
    limit: usize,
}

impl BufferBodyLayer {
    /// Buffers bodies of up to `limit` bytes; a larger body fails with `INVALID_INPUT`.
    #[must_use]
    pub fn new(limit: usize) -> Self {
        BufferBodyLayer { limit }
    }
}

impl Default for BufferBodyLayer {
    fn default() -> Self {
        Self::new(DEFAULT_BODY_LIMIT)
    }
}

impl<S> Layer<S> for BufferBodyLayer {
    type Service = BufferBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferBody {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of [`BufferBodyLayer`].
#[derive(Debug, Clone)]
pub struct BufferBody<S> {
    inner: S,
    limit: usize,
}

impl<S> BufferBody<S> {
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

impl<S, B> Service<Request<B>> for BufferBody<S>
where
    S: Service<BufferedRequest> + Clone,
    S::Error: IntoToolError,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = BufferBodyFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        BufferBodyFuture {
            state: State::Collecting {
                collect: Limited::new(body, self.limit).collect(),
                parts: Some(parts),
                service: Some(service),
            },
            limit: self.limit,
        }
    }
}

pin_project! {
    /// The future of [`BufferBody`]: collects the body, then calls the inner service.
    pub struct BufferBodyFuture<S, B>
    where
        S: Service<BufferedRequest>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        state: State<S, B>,
        limit: usize,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<BufferedRequest>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        Collecting {
            #[pin]
            collect: Collect<Limited<B>>,
            parts: Option<Parts>,
            service: Option<S>,
        },
        Calling {
            #[pin]
            future: S::Future,
        },
    }
}

impl<S, B> Future for BufferBodyFuture<S, B>
where
    S: Service<BufferedRequest>,
    S::Error: IntoToolError,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Result<S::Response, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Collecting {
                    collect,
                    parts,
                    service,
                } => {
                    let collected = match ready!(collect.poll(cx)) {
                        Ok(c) => c,
                        Err(e) => return Poll::Ready(Err(body_error(e, *this.limit))),
                    };
                    let (Some(parts), Some(mut service)) = (parts.take(), service.take()) else {
                        return Poll::Ready(Err(ToolError::internal(
                            "buffer future polled after completion",
                        )));
                    };
                    let req = Request::from_parts(parts, Full::new(collected.to_bytes()));
                    let future = service.call(req);
                    this.state.set(State::Calling { future });
                }
                StateProj::Calling { future } => {
                    return future.poll(cx).map_err(IntoToolError::into_tool_error);
                }
            }
        }
    }
}
