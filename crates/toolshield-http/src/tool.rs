//! [`HttpTool`]: a `Service<ToolRequest>` over an HTTP client, so the whole toolshield
//! stack (idempotency included) applies to HTTP calls.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, SET_COOKIE};
use http::{Method, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value};
use toolshield_core::http_impls::{http_method_kind, http_status_kind, IDEMPOTENCY_KEY_HEADER};
use toolshield_core::{
    idempotency_key_of, BoxError, CallKind, ErrorKind, ShieldRequest, ToolError, ToolRequest,
    ToolResponse,
};
use tower_service::Service;

use crate::body::{body_error, BufferedRequest, DEFAULT_BODY_LIMIT};
use crate::error::{client_error, client_error_for};
use crate::retry_after::retry_after_from_headers;

/// hyper-util's legacy client over plain TCP (no TLS), sending buffered bodies.
pub type HyperClient = Client<HttpConnector, Full<Bytes>>;

/// A hyper-util legacy client on the tokio runtime (HTTP/1, no TLS).
pub fn hyper_client() -> HyperClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Builds the [`ToolRequest`] of an HTTP call: the payload is
/// `{"method", "url", "headers"?, "body"?}`, the [`CallKind`] follows the method, and an
/// `Idempotency-Key` header (any spelling) becomes the request's idempotency key, so the
/// idempotency layer dedupes on the key the server sees. A blank key (`""`, `"  "`) is
/// no key; two different keys under two spellings are no key here and `INVALID_INPUT`
/// when the request is built ([`build_request`]).
pub fn http_tool_request(tool: impl Into<Arc<str>>, payload: Value) -> ToolRequest {
    let method = payload
        .get("method")
        .and_then(Value::as_str)
        .and_then(|m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()).ok())
        .unwrap_or(Method::GET);
    let key = payload_key(&payload).ok().flatten().map(str::to_owned);
    let mut req = ToolRequest::new(tool, payload).kind(http_method_kind(&method));
    if let Some(key) = key {
        req = req.idempotency_key(key);
    }
    req
}

/// The one `Idempotency-Key` of a payload's `headers`, whatever its spelling, without the
/// whitespace around it: blank values are no key, the same value under two spellings is one key, two different
/// values are `INVALID_INPUT`.
fn payload_key(payload: &Value) -> Result<Option<&str>, ToolError> {
    let Some(headers) = payload.get("headers").and_then(Value::as_object) else {
        return Ok(None);
    };
    let mut key: Option<&str> = None;
    for (name, value) in headers {
        if !name.eq_ignore_ascii_case(IDEMPOTENCY_KEY_HEADER) {
            continue;
        }
        // As the request's own key is read: whitespace around it is not part of it.
        let Some(value) = value.as_str().map(str::trim).filter(|v| !v.is_empty()) else {
            continue;
        };
        match key {
            Some(first) if first != value => {
                return Err(ToolError::invalid_input(
                    "two different `Idempotency-Key` headers: send one key per request",
                ))
            }
            _ => key = Some(value),
        }
    }
    Ok(key)
}

/// Turns a [`ToolRequest`] payload `{"method", "url", "headers"?, "body"?}` into an HTTP
/// request. `method` defaults to GET; `body` is sent as is when it is a string, as JSON
/// (with `content-type: application/json` unless set) otherwise. Problems are
/// `INVALID_INPUT`; their messages never repeat the URL (it may hold credentials).
///
/// One `Idempotency-Key` header at most is sent: blank values are dropped, the same key
/// under two spellings is sent once, and two different keys are `INVALID_INPUT`.
pub fn build_request(payload: &Value) -> Result<BufferedRequest, ToolError> {
    let idempotency_key = payload_key(payload)?;
    let method = match payload.get("method") {
        None | Some(Value::Null) => Method::GET,
        Some(Value::String(m)) => Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            // Not repeated: the value is the caller's, of any length and content.
            .map_err(|_| ToolError::invalid_input("`method` is not a valid http method"))?,
        Some(_) => return Err(ToolError::invalid_input("`method` must be a string")),
    };
    let url = payload
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::invalid_input("`url` is required and must be a string"))?;
    let uri: http::Uri = url
        .parse()
        // The URL is not repeated in the error: it may carry credentials or an API key,
        // and the error reaches logs and the model.
        .map_err(|_| ToolError::invalid_input("`url` is not a valid url"))?;
    if uri.scheme().is_none() || uri.host().is_none() {
        return Err(ToolError::invalid_input(
            "`url` must be absolute (a scheme and a host)",
        ));
    }
    let mut builder = Request::builder().method(method).uri(uri);
    let mut has_content_type = false;
    match payload.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(headers)) => {
            for (name, value) in headers {
                let value = value.as_str().ok_or_else(|| {
                    ToolError::invalid_input(format!("header `{name}` must be a string"))
                })?;
                if name.eq_ignore_ascii_case(IDEMPOTENCY_KEY_HEADER) {
                    // Added once, below.
                    continue;
                }
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| ToolError::invalid_input(format!("invalid header `{name}`")))?;
                let value = HeaderValue::from_str(value).map_err(|_| {
                    ToolError::invalid_input(format!("invalid value of header `{name}`"))
                })?;
                has_content_type |= name == CONTENT_TYPE;
                builder = builder.header(name, value);
            }
        }
        Some(_) => return Err(ToolError::invalid_input("`headers` must be an object")),
    }
    if let Some(key) = idempotency_key {
        builder = builder.header(IDEMPOTENCY_KEY_HEADER, key_header(key)?);
    }
    let body = match payload.get("body") {
        None | Some(Value::Null) => Bytes::new(),
        Some(Value::String(s)) => Bytes::from(s.clone()),
        Some(json) => {
            if !has_content_type {
                builder = builder.header(CONTENT_TYPE, "application/json");
            }
            Bytes::from(serde_json::to_vec(json)?)
        }
    };
    builder
        .body(Full::new(body))
        .map_err(|e| ToolError::invalid_input(format!("invalid http request: {e}")))
}

fn key_header(key: &str) -> Result<HeaderValue, ToolError> {
    HeaderValue::from_str(key)
        .map_err(|_| ToolError::invalid_input("the idempotency key is not a valid header value"))
}

/// Sends the request's idempotency key as the `Idempotency-Key` header of a `Mutating`
/// call: a key the stack dedupes on (given, or derived by the idempotency layer) and the
/// retry layer repeats under must be one the server sees, on every attempt.
fn attach_key(req: &ToolRequest, http_req: &mut BufferedRequest) -> Result<(), ToolError> {
    if req.call_kind() != CallKind::Mutating {
        return Ok(());
    }
    let Some(key) = idempotency_key_of(req) else {
        return Ok(());
    };
    match http_req.headers().get(IDEMPOTENCY_KEY_HEADER) {
        Some(sent) if sent.as_bytes() != key.as_bytes() => Err(ToolError::invalid_input(
            "the `Idempotency-Key` header differs from the request's idempotency key",
        )),
        Some(_) => Ok(()),
        None => {
            let value = key_header(key)?;
            http_req.headers_mut().insert(IDEMPOTENCY_KEY_HEADER, value);
            Ok(())
        }
    }
}

/// Calls an HTTP client for each [`ToolRequest`] (payload as in [`build_request`]) and
/// answers `{"status", "headers", "body"}`; `body` is parsed JSON when the response says
/// it is JSON, text otherwise; `headers` holds every response header but `Set-Cookie`
/// (a credential, which the model, logs and a shared cache must not see), a repeated
/// header joined by `, `. A non-2xx/3xx status is an error of the kind
/// [`http_status_kind`] gives; a 429 and the retriable 408/425/502/503/504 keep their
/// `Retry-After` (both forms, the longest of several), the other error statuses, never
/// retried, carry no wait.
///
/// Build requests with [`http_tool_request`] so the kind and the idempotency key follow
/// the method and the `Idempotency-Key` header.
///
/// A `Mutating` call's idempotency key (given, or derived by the idempotency layer) is
/// sent as its `Idempotency-Key` header, the same on every attempt; a payload header
/// that differs from it is `INVALID_INPUT`. A connection lost after a `Mutating` request
/// was sent is `OUTCOME_UNKNOWN` ([`client_error_for`](crate::client_error_for)).
#[derive(Clone)]
pub struct HttpTool<C = HyperClient> {
    client: C,
    body_limit: usize,
}

impl<C> fmt::Debug for HttpTool<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTool")
            .field("body_limit", &self.body_limit)
            .finish_non_exhaustive()
    }
}

impl HttpTool<HyperClient> {
    /// Over a fresh [`hyper_client`].
    #[must_use]
    pub fn new() -> Self {
        Self::with_client(hyper_client())
    }
}

impl Default for HttpTool<HyperClient> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> HttpTool<C> {
    /// Over any client that is a `Service<http::Request<Full<Bytes>>>`.
    #[must_use]
    pub fn with_client(client: C) -> Self {
        HttpTool {
            client,
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }

    /// The largest response body read (default 4 MiB); a larger one is `INVALID_INPUT`,
    /// or `OUTCOME_UNKNOWN` for a `Mutating` call (the server ran it: its key is kept).
    #[must_use]
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }
}

/// The future of [`HttpTool`] (boxed: one network round trip dwarfs the allocation).
pub type HttpToolFuture = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

impl<C, RB> Service<ToolRequest> for HttpTool<C>
where
    C: Service<BufferedRequest, Response = Response<RB>> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = HttpToolFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.client.poll_ready(cx).map_err(client_error)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let limit = self.body_limit;
        let kind = req.call_kind();
        let http_req = build_request(req.payload()).and_then(|mut http_req| {
            attach_key(&req, &mut http_req)?;
            // The tool's kind, not the method's, decides what the client below makes of
            // a connection lost after sending (a GET declared mutating may have taken
            // effect): the same classification here and in any client or layer below.
            if let Some(state) = http_req.call_state_mut() {
                state.set_kind(Some(kind));
            }
            Ok(http_req)
        });
        let http_req = match http_req {
            Ok(r) => r,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let clone = self.client.clone();
        let mut client = std::mem::replace(&mut self.client, clone);
        Box::pin(async move {
            let host = http_req.uri().host().unwrap_or("").to_owned();
            let response = client
                .call(http_req)
                .await
                .map_err(|e| client_error_for(kind, e))?;
            into_tool_response(response, &host, limit, kind).await
        })
    }
}

async fn into_tool_response<B>(
    response: Response<B>,
    host: &str,
    limit: usize,
    kind: CallKind,
) -> Result<ToolResponse, ToolError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    if let Some(kind) = http_status_kind(parts.status) {
        let mut error = ToolError::new(kind, format!("http {} from `{host}`", parts.status));
        // Only where it means "come back later": a wait on an error that is never
        // retried (a 401, a 500) would mislead whoever reads it (a fallback chain reports
        // its tiers' shortest wait), as `toolshield_reqwest::error_for_status` also holds.
        let waits = matches!(
            kind,
            ErrorKind::RateLimited | ErrorKind::UpstreamUnavailable
        );
        if let Some(wait) =
            retry_after_from_headers(&parts.headers, SystemTime::now()).filter(|_| waits)
        {
            error = error.with_retry_after(wait);
        }
        return Err(error);
    }
    let bytes = Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| {
            // A body cut off mid-way is a connection lost after sending.
            if e.is::<LengthLimitError>() {
                if kind == CallKind::Mutating {
                    // The server ran the mutation; only its answer is too large. A
                    // non-retriable failure would free the idempotency key after a short
                    // TTL, and a repeat would run it again.
                    return ToolError::new(
                        ErrorKind::OutcomeUnknown,
                        format!(
                            "http response body exceeds the {limit} byte limit: the \
                             request was answered, but its result could not be read"
                        ),
                    );
                }
                body_error(e, limit)
            } else {
                client_error_for(kind, e)
            }
        })?
        .to_bytes();
    let mut headers = Map::new();
    for (name, value) in &parts.headers {
        // The server's session credential for this client: the output reaches the model,
        // logs and a shared cache (another caller would be handed it). Never joined with
        // `, ` either, as RFC 6265 forbids for this header.
        if name == SET_COOKIE {
            continue;
        }
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match headers.get_mut(name.as_str()) {
            Some(Value::String(existing)) => {
                existing.push_str(", ");
                existing.push_str(&value);
            }
            _ => {
                headers.insert(name.as_str().to_owned(), Value::String(value));
            }
        }
    }
    let is_json = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json"));
    let body = if is_json {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    } else {
        Value::String(String::from_utf8_lossy(&bytes).into_owned())
    };
    Ok(ToolResponse::new(serde_json::json!({
        "status": parts.status.as_u16(),
        "headers": headers,
        "body": body,
    })))
}
