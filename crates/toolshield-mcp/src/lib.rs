#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! - [`McpClientService`]: every call goes to the MCP tool named by the request (a
//!   `{server}__` prefix stripped, for `RouterBuilder::server`); cheap to clone, one
//!   shared connection.
//! - [`McpTool`]: one fixed MCP tool, for `RouterBuilder::tool` under a local name.
//! - Results: a result is a response whose output is the MCP `CallToolResult` as JSON
//!   (`content`, `structuredContent`, `isError`). An `isError: true` result is kept as a
//!   response by default, which the core classifier counts as an `EXECUTION_FAILED`
//!   failure; [`IsErrorPolicy::Error`] turns it into an error of a chosen kind instead.
//! - Errors: unknown tool -> `NOT_FOUND`, invalid params -> `INVALID_INPUT`, other
//!   server errors -> `EXECUTION_FAILED` (server text cut at [`MAX_MESSAGE`] bytes),
//!   transport closed before the call -> `CONNECTION_FAILED`, transport closed or failed
//!   during the call -> `OUTCOME_UNKNOWN` for a `Mutating` call (never retried) and
//!   `CONNECTION_FAILED` otherwise ([`map_call_error`]), client timeout -> `TIMEOUT`.
//!
//! - Cancellation reaches the server: a call cancelled by its token, timed out or dropped
//!   before the answer sends `notifications/cancelled` for its request id, exactly once
//!   (reason [`REASON_CANCELLED`] or [`REASON_ABANDONED`]); none after an answer.
//! - MCP tasks: a call the server answers with a task is polled with backoff
//!   ([`TASK_POLL_FIRST`] to [`TASK_POLL_MAX`], the server's hint honoured up to
//!   [`TASK_POLL_HINT_MAX`]) within the call's deadline, cancelled with `tasks/cancel` when
//!   the call is cancelled, times out or is dropped, and its id is recorded under
//!   [`RELATED_TASK_META`] in the output's `_meta`. Under the idempotency layer the task id
//!   is also written to the call's claim before polling, and a duplicate that takes the
//!   claim over after a crash follows that task instead of calling the tool again.
//! - Progress: the server's `notifications/progress` for a call (and, for a task, each
//!   poll or status notification that says it is working) are reported on the request's
//!   progress handle, so the attempt timeout's idle limit and provenance see them
//!   ([`ProgressRouter`], [`WithProgress`]; set up by [`McpClientService::connect`]).
//!
//! It is the innermost service of the default stack: the attempt timeout drops its
//! future, which abandons the request and tells the server; the server may still finish
//! the call (cancellation in MCP is cooperative).

mod cancel;
mod map;
mod progress;
mod service;
mod task;

pub use cancel::{REASON_ABANDONED, REASON_CANCELLED};
pub use map::{
    map_call_error, map_protocol_error, map_result, map_service_error, result_text, IsErrorPolicy,
    MAX_MESSAGE,
};
pub use progress::{ProgressRouter, WithProgress};
pub use service::{McpClientService, McpFuture, McpTool};
pub use task::{RELATED_TASK_META, TASK_POLL_FIRST, TASK_POLL_HINT_MAX, TASK_POLL_MAX};
