//! [`Client`]: `reqwest::Client` as a `Service<http::Request<B>>`.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::response::Parts;
use http_body::Body as _;
use pin_project_lite::pin_project;
use toolshield_core::http_impls::{http_method_kind, http_status_kind, RetryAfter};
use toolshield_core::{CallKind, ErrorKind, ShieldRequest, ToolError};
use toolshield_http::{retry_after_from_headers, DEFAULT_BODY_LIMIT};
use tower_service::Service;

use crate::body::RequestBody;
use crate::error::reqwest_error_for;

/// The future reqwest returns for a request (its `Pending`).
type Pending = <reqwest::Client as Service<reqwest::Request>>::Future;

/// A [`reqwest::Client`] as a tower `Service<http::Request<B>>`, so toolshield's generic
/// layers (retry, breaker, timeout, cancel, metrics) wrap it with the HTTP rules of
/// `toolshield_core::http_impls`.
///
/// - Requests: any [`RequestBody`] (`Bytes`, `String`, `Vec<u8>`, `Full<Bytes>`, ...);
///   the retry layer needs the request to be `Clone`, which these bodies are.
/// - Responses: `http::Response<Bytes>`, read in full (up to a limit, 4 MiB by default)
///   inside the call, so an attempt timeout covers the whole exchange and a body cut off
///   mid-way is an error of this call. Every status is a response: the layers classify
///   it (429 `RATE_LIMITED`, 502/503/504 `UPSTREAM_UNAVAILABLE`, ...;
///   [`error_for_status`](crate::error_for_status) turns one into an error). A
///   `Retry-After`, delta seconds or HTTP date, is left on the response as a
///   [`RetryAfter`] extension, which the retry layer honours.
/// - Errors: [`ToolError`] ([`reqwest_error_for`](crate::reqwest_error_for): timeouts
///   `TIMEOUT`, failed connects `CONNECTION_FAILED`, a connection lost after a `POST`
///   was sent `OUTCOME_UNKNOWN`, ...), the reqwest error kept as the source. A response
///   body over the limit is `INVALID_INPUT`, or `OUTCOME_UNKNOWN` for a mutating call
///   (the server ran it; only its answer could not be read). An error status (429, 503,
///   ...) whose body is over the limit stays a response, its body cut at the limit, so
///   its status and `Retry-After` still decide what happens.
///
/// Cheap to clone: reqwest's client is a handle to one connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    inner: reqwest::Client,
    body_limit: usize,
}

impl Client {
    /// Wraps `client`: its settings (TLS, proxies, redirects, default headers, its own
    /// timeouts) apply to every request.
    pub fn new(client: reqwest::Client) -> Self {
        Client {
            inner: client,
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }

    /// The largest response body read, in bytes (default 4 MiB); a larger one fails the
    /// call with `INVALID_INPUT`, or `OUTCOME_UNKNOWN` for a mutating call (the server
    /// ran it), while an error status keeps its response, the body cut at the limit.
    #[must_use]
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// The reqwest client.
    pub fn get_ref(&self) -> &reqwest::Client {
        &self.inner
    }

    /// The reqwest client, mutably.
    pub fn get_mut(&mut self) -> &mut reqwest::Client {
        &mut self.inner
    }

    /// Unwraps the reqwest client.
    pub fn into_inner(self) -> reqwest::Client {
        self.inner
    }
}

impl Default for Client {
    /// Over `reqwest::Client::new()`.
    fn default() -> Self {
        Self::new(reqwest::Client::new())
    }
}

impl From<reqwest::Client> for Client {
    fn from(client: reqwest::Client) -> Self {
        Self::new(client)
    }
}

impl<B: RequestBody> Service<http::Request<B>> for Client {
    type Response = http::Response<Bytes>;
    type Error = ToolError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // reqwest's client is always ready: its pool makes connections on demand.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The kind decides what a connection lost after sending becomes: the method's,
        // unless the call state overrides it.
        let kind = ShieldRequest::call_kind(&req).unwrap_or_else(|| http_method_kind(req.method()));
        let limit = self.body_limit;
        let req = req.map(RequestBody::into_reqwest_body);
        let state = match reqwest::Request::try_from(req) {
            Ok(req) => State::Sending {
                pending: self.inner.call(req),
            },
            Err(e) => State::Failed {
                error: Some(reqwest_error_for(kind, e)),
            },
        };
        ResponseFuture { state, kind, limit }
    }
}

pin_project! {
    /// The future of [`Client`]: sends the request, then reads the response body.
    pub struct ResponseFuture {
        #[pin]
        state: State,
        kind: CallKind,
        limit: usize,
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Failed { .. } => "failed",
            State::Sending { .. } => "sending",
            State::Reading { .. } => "reading",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        // The request could not be built (a URL reqwest rejects), or the future is done.
        Failed {
            error: Option<ToolError>,
        },
        Sending {
            #[pin]
            pending: Pending,
        },
        Reading {
            #[pin]
            body: reqwest::Body,
            read: BytesMut,
            parts: Option<Parts>,
        },
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<Bytes>, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let kind = *this.kind;
        loop {
            match this.state.as_mut().project() {
                StateProj::Failed { error } => {
                    let error = error.take().unwrap_or_else(|| {
                        ToolError::internal("reqwest future polled after completion")
                    });
                    return Poll::Ready(Err(error));
                }
                StateProj::Sending { pending } => {
                    let response = match ready!(pending.poll(cx)) {
                        Ok(response) => response,
                        Err(e) => {
                            this.state.set(State::Failed { error: None });
                            return Poll::Ready(Err(reqwest_error_for(kind, e)));
                        }
                    };
                    let (parts, body) =
                        http::Response::<reqwest::Body>::from(response).into_parts();
                    this.state.set(State::Reading {
                        body,
                        read: BytesMut::new(),
                        parts: Some(parts),
                    });
                }
                StateProj::Reading {
                    mut body,
                    read,
                    parts,
                } => {
                    let limit = *this.limit;
                    let done = loop {
                        match ready!(body.as_mut().poll_frame(cx)) {
                            None => break Ok(()),
                            // A connection lost mid-body, reqwest's own timeout.
                            Some(Err(e)) => break Err(reqwest_error_for(kind, e)),
                            Some(Ok(frame)) => {
                                // Trailers carry no body bytes.
                                let Ok(data) = frame.into_data() else {
                                    continue;
                                };
                                if data.len() <= limit - read.len() {
                                    read.extend_from_slice(&data);
                                    continue;
                                }
                                // An error status is read for its status and headers:
                                // its body is cut, never turned into another error.
                                let error_status = parts
                                    .as_ref()
                                    .is_some_and(|p| http_status_kind(p.status).is_some());
                                if error_status {
                                    let room = limit - read.len();
                                    read.extend_from_slice(&data[..room]);
                                    break Ok(());
                                }
                                break Err(over_limit(kind, limit));
                            }
                        }
                    };
                    let bytes = std::mem::take(read).freeze();
                    let parts = parts.take();
                    this.state.set(State::Failed { error: None });
                    if let Err(e) = done {
                        return Poll::Ready(Err(e));
                    }
                    let Some(parts) = parts else {
                        return Poll::Ready(Err(ToolError::internal(
                            "reqwest future lost its response",
                        )));
                    };
                    let mut response = http::Response::from_parts(parts, bytes);
                    note_retry_after(&mut response);
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}

/// A successful response whose body is over the limit: `INVALID_INPUT`, except for a
/// mutating call, which the server ran: `OUTCOME_UNKNOWN` then, so the idempotency layer
/// keeps its key (a non-retriable failure would free it after a short TTL, and a repeat
/// would run the mutation again).
fn over_limit(kind: CallKind, limit: usize) -> ToolError {
    if kind == CallKind::Mutating {
        return ToolError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "http response body exceeds the {limit} byte limit: the request was \
                 answered, but its result could not be read"
            ),
        );
    }
    ToolError::new(
        ErrorKind::InvalidInput,
        format!("http response body exceeds the {limit} byte limit"),
    )
}

/// Leaves the response's `Retry-After` (delta seconds or HTTP date, the latter measured
/// from now; the longest when there are several) as a [`RetryAfter`] extension: core reads
/// only the delta form itself.
fn note_retry_after(response: &mut http::Response<Bytes>) {
    if let Some(wait) = retry_after_from_headers(response.headers(), SystemTime::now()) {
        response.extensions_mut().insert(RetryAfter(wait));
    }
}
