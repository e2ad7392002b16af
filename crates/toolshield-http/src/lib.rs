#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! `toolshield-core` implements [`ShieldRequest`](toolshield_core::ShieldRequest) for
//! `http::Request<B>` and [`ShieldResponse`](toolshield_core::ShieldResponse) for
//! `http::Response<B>` (see [`toolshield_core::http_impls`]), so the generic layers
//! (timeout, retry, breaker, cancel, metrics) wrap any HTTP client that is a tower
//! service. This crate adds what an HTTP client needs on top:
//!
//! - [`BufferBodyLayer`] / [`buffer_request`]: bodies collected once (with a size limit) into
//!   `http::Request<Full<Bytes>>`, which is `Clone`, so requests can be retried;
//! - [`HttpErrorLayer`] / [`client_error_for`]: the client's errors as
//!   [`ToolError`](toolshield_core::ToolError)s, keeping the source: failed before
//!   sending `CONNECTION_FAILED`, timeouts `TIMEOUT`, a connection lost after sending
//!   `OUTCOME_UNKNOWN` for a mutating call (never retried) and `UPSTREAM_UNAVAILABLE`
//!   otherwise;
//! - the method rules ([`http_method_kind`]): GET, HEAD, PUT, DELETE, OPTIONS are
//!   idempotent and retried; POST and PATCH are mutating and repeated only under an
//!   `Idempotency-Key` header the server sees ([`HttpTool`] sends the request's key,
//!   given or derived, as that header);
//! - the status rules ([`http_status_kind`]): 429 `RATE_LIMITED` with its
//!   `Retry-After` ([`parse_retry_after`], both forms), 408/425/502/503/504
//!   `UPSTREAM_UNAVAILABLE`, other 5xx `EXECUTION_FAILED` (counted, not retried), 401/403
//!   `UNAUTHORIZED`, 404 `NOT_FOUND`, other 4xx `INVALID_INPUT` (neither retried nor
//!   counted);
//! - [`HttpTool`]: a `Service<ToolRequest>` over an HTTP client, so the whole default
//!   stack, idempotency included, applies to HTTP calls.
//!
//! Breakers key on the host by default; insert an [`HttpRoute`] in the request's
//! extensions to key on a route template instead.

mod body;
mod error;
mod retry_after;
mod tool;

pub use body::{
    body_error, buffer_request, BufferBody, BufferBodyFuture, BufferBodyLayer, BufferedRequest,
    DEFAULT_BODY_LIMIT,
};
pub use error::{client_error, client_error_for, HttpErrorFuture, HttpErrorLayer, HttpErrors};
pub use retry_after::{parse_retry_after, retry_after_from_headers};
pub use tool::{
    build_request, http_tool_request, hyper_client, HttpTool, HttpToolFuture, HyperClient,
};
pub use toolshield_core::http_impls::{
    http_method_kind, http_status_kind, HttpAttempts, HttpRoute, RetryAfter, IDEMPOTENCY_KEY_HEADER,
};
