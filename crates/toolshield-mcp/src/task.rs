//! Following an MCP task (the `io.modelcontextprotocol/tasks` extension) to its end, as
//! one logical call: poll `tasks/get` with backoff within the call's deadline, cancel with
//! `tasks/cancel` when the call is cancelled, times out or is dropped.
//!
//! A call guarded by the idempotency layer records the task id as its resume token when
//! the task is created; a call that took over the claim of a process that died resumes
//! that task instead of calling the tool again ([`TaskCall::resume`]).

use std::time::Duration;

use rmcp::model::{CallToolResult, CreateTaskResult, GetTaskParams, TaskPayload};
use rmcp::service::RoleClient;
use rmcp::{ErrorData, Peer, ServiceError};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_core::{CallKind, ErrorKind, Resume, ToolError, ToolResponse};

use crate::cancel::TaskCancel;
use crate::map::{capped, map_call_error, map_protocol_error, map_result, IsErrorPolicy};
use crate::progress::ProgressWatch;

/// The `_meta` key under which a response that came from a task records it:
/// `output._meta["io.modelcontextprotocol/related-task"].taskId`.
pub const RELATED_TASK_META: &str = "io.modelcontextprotocol/related-task";

/// First wait before polling a task (unless the server suggests a longer one).
pub const TASK_POLL_FIRST: Duration = Duration::from_millis(50);

/// Longest wait between two polls that toolshield's own backoff reaches.
pub const TASK_POLL_MAX: Duration = Duration::from_secs(2);

/// Longest poll interval accepted from a server (`pollIntervalMs`): a larger hint is cut
/// to this, so a server cannot park a call.
pub const TASK_POLL_HINT_MAX: Duration = Duration::from_secs(30);

/// What a task-following call needs from its request.
pub(crate) struct TaskCall<'a> {
    pub(crate) peer: &'a Peer<RoleClient>,
    pub(crate) name: &'a str,
    pub(crate) token: &'a CancellationToken,
    pub(crate) deadline: Option<Instant>,
    pub(crate) kind: CallKind,
    pub(crate) policy: IsErrorPolicy,
    /// The call's progress: a poll or status notification that says "working" is a
    /// heartbeat, so the idle limit does not cut a task the server is working on.
    pub(crate) progress: &'a ProgressWatch,
    /// The call's resume handle (installed by the idempotency layer on a call it claimed):
    /// a created task's id is recorded there before it is polled.
    pub(crate) resume: Option<&'a Resume>,
}

/// The wait before the next poll: toolshield's backoff, or the server's hint when longer
/// (capped at [`TASK_POLL_HINT_MAX`]).
fn next_wait(backoff: Duration, hint_ms: Option<u64>) -> Duration {
    let hint = hint_ms.map_or(Duration::ZERO, Duration::from_millis);
    backoff.max(hint.min(TASK_POLL_HINT_MAX))
}

/// Records the task id in the response's output `_meta`.
fn stamp_task(mut response: ToolResponse, task_id: &str) -> ToolResponse {
    if let Value::Object(output) = &mut response.output {
        let meta = output
            .entry("_meta")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Value::Object(meta) = meta {
            meta.insert(
                RELATED_TASK_META.to_owned(),
                serde_json::json!({ "taskId": task_id }),
            );
        }
    }
    response
}

impl TaskCall<'_> {
    /// The task to resume is not there any more (expired, or the server restarted): its
    /// outcome is unknown, and calling the tool again could repeat a mutation.
    fn not_resumable(&self, task_id: &str, error: &ErrorData) -> ToolError {
        ToolError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "mcp task `{}` for `{}` could not be resumed: `tasks/get` failed: {} ({}); \
                 the tool is not called again, as its first run may have taken effect",
                capped(task_id),
                self.name,
                capped(&error.message),
                error.code.0
            ),
        )
    }

    /// A mutating call's task whose `tasks/get` failed after the server had answered for
    /// it: `OUTCOME_UNKNOWN`, never run again.
    fn lost(&self, task_id: &str, error: &ErrorData) -> ToolError {
        ToolError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "mcp task `{}` for `{}` was lost: `tasks/get` failed: {} ({}); the tool is \
                 not called again, as it may have taken effect",
                capped(task_id),
                self.name,
                capped(&error.message),
                error.code.0
            ),
        )
    }

    fn cancelled(&self, task_id: &str) -> ToolError {
        ToolError::cancelled(format!(
            "mcp call of `{}` cancelled (task `{}` cancelled)",
            self.name,
            capped(task_id)
        ))
    }

    /// Records the new task's id on the call's resume handle (if any), then polls the task
    /// until it ends, the token fires or the deadline passes.
    pub(crate) async fn follow(self, created: CreateTaskResult) -> Result<ToolResponse, ToolError> {
        let task_id = created.task.task_id.clone();
        // Armed until the task reaches a terminal status: every other way out (cancel,
        // deadline, a poll that failed, the future dropped) asks the server to stop it.
        let mut guard = TaskCancel::new(self.peer.clone(), task_id.clone());
        if let Some(resume) = self.resume {
            // Written before the first poll, so a process that dies from here on leaves
            // the id for the owner that takes the claim over. A failed write costs only
            // that: the call goes on.
            let recorded = tokio::select! {
                biased;
                () = self.token.cancelled() => {
                    guard.cancel();
                    return Err(self.cancelled(&task_id));
                }
                r = resume.record(&task_id) => r,
            };
            match recorded {
                Ok(true) => {}
                Ok(false) => tracing::warn!(
                    tool = %self.name,
                    "mcp: the idempotency claim was lost before the task id was recorded"
                ),
                Err(e) => tracing::warn!(
                    tool = %self.name,
                    error = %e,
                    "mcp: could not record the task id for resuming; polling goes on"
                ),
            }
        }
        let hint = created.task.poll_interval_ms;
        self.poll(task_id, guard, hint, false).await
    }

    /// Follows the existing task `task_id` (the resume token a call that took over an
    /// idempotency claim was given): polls it at once and then as [`follow`](Self::follow)
    /// does, with no `tools/call`. A task the server does not know (any JSON-RPC error on
    /// the first `tasks/get`) is `OUTCOME_UNKNOWN`: the first run may have taken effect, so
    /// the tool is not called again.
    pub(crate) async fn resume(self, task_id: &str) -> Result<ToolResponse, ToolError> {
        let guard = TaskCancel::new(self.peer.clone(), task_id.to_owned());
        self.poll(task_id.to_owned(), guard, None, true).await
    }

    async fn poll(
        self,
        task_id: String,
        mut guard: TaskCancel,
        mut hint: Option<u64>,
        resumed: bool,
    ) -> Result<ToolResponse, ToolError> {
        // The task's status notifications are heartbeats of this call while it is polled.
        let _status = self.progress.task(&task_id);
        let mut backoff = TASK_POLL_FIRST;
        // A resumed task has waited long enough (a whole lease, at least): polled at once.
        let mut known = !resumed;
        loop {
            let wait = if known {
                next_wait(backoff, hint)
            } else {
                Duration::ZERO
            };
            if known {
                backoff = (backoff * 2).min(TASK_POLL_MAX);
            }
            let mut wake = Instant::now() + wait;
            if let Some(deadline) = self.deadline {
                if Instant::now() >= deadline {
                    guard.cancel();
                    return Err(ToolError::timeout(format!(
                        "mcp task `{}` for `{}` did not finish before the deadline",
                        capped(&task_id),
                        self.name
                    )));
                }
                wake = wake.min(deadline);
            }
            tokio::select! {
                biased;
                () = self.token.cancelled() => {
                    guard.cancel();
                    return Err(self.cancelled(&task_id));
                }
                () = tokio::time::sleep_until(wake) => {}
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                // Checked at the top of the loop.
                continue;
            }
            let polled = tokio::select! {
                // The poll's answer first: a task seen completed as the token fires is
                // returned, and never sent `tasks/cancel`.
                biased;
                r = self.peer.get_task(GetTaskParams::new(task_id.clone())) => r,
                () = self.token.cancelled() => {
                    guard.cancel();
                    return Err(self.cancelled(&task_id));
                }
            };
            let detailed = match polled {
                Ok(got) => got.task,
                Err(ServiceError::McpError(data)) if !known => {
                    return Err(self.not_resumable(&task_id, &data));
                }
                // A task the server no longer answers for (forgotten, or its polling
                // refused): a mutation may have taken effect, and must not be run again.
                Err(ServiceError::McpError(data)) if self.kind == CallKind::Mutating => {
                    return Err(self.lost(&task_id, &data));
                }
                // The guard cancels the task: nobody will poll it again. A mutation's task
                // was created: a poll answered with something unexpected says nothing of
                // its effect either.
                Err(e) => {
                    let error = map_call_error(self.name, e, self.kind);
                    if self.kind == CallKind::Mutating && error.kind() == ErrorKind::ExecutionFailed
                    {
                        return Err(ToolError::new(
                            ErrorKind::OutcomeUnknown,
                            error.message().to_owned(),
                        ));
                    }
                    return Err(error);
                }
            };
            known = true;
            hint = detailed.task.poll_interval_ms;
            match detailed.payload {
                TaskPayload::Working => {
                    self.progress
                        .working(detailed.task.status_message.as_deref());
                }
                TaskPayload::Completed { result } => {
                    guard.disarm();
                    let result: CallToolResult = serde_json::from_value(Value::Object(result))
                        .map_err(|_| {
                            // The tool ran: a mutation's effect is not known from this.
                            let kind = if self.kind == CallKind::Mutating {
                                ErrorKind::OutcomeUnknown
                            } else {
                                ErrorKind::ExecutionFailed
                            };
                            ToolError::new(
                                kind,
                                format!(
                                    "mcp task `{}` for `{}` completed with a malformed result",
                                    capped(&task_id),
                                    self.name
                                ),
                            )
                        })?;
                    return map_result(self.name, result, self.policy)
                        .map(|res| stamp_task(res, &task_id));
                }
                TaskPayload::Failed { error } => {
                    guard.disarm();
                    return Err(
                        match serde_json::from_value::<ErrorData>(Value::Object(error)) {
                            Ok(data) => map_protocol_error(self.name, &data),
                            Err(_) => ToolError::execution_failed(format!(
                                "mcp task `{}` for `{}` failed",
                                capped(&task_id),
                                self.name
                            )),
                        },
                    );
                }
                TaskPayload::Cancelled => {
                    guard.disarm();
                    return Err(ToolError::new(
                        ErrorKind::ExecutionFailed,
                        format!(
                            "mcp task `{}` for `{}` was cancelled by the server",
                            capped(&task_id),
                            self.name
                        ),
                    ));
                }
                // Input requests (and statuses added later) need a client that can answer
                // them; this one cannot, so the task is cancelled (by the guard).
                _ => {
                    return Err(ToolError::execution_failed(format!(
                        "mcp task `{}` for `{}` asked for client input, which this client does not support",
                        capped(&task_id),
                        self.name
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_takes_the_longer_of_backoff_and_hint_with_the_hint_capped() {
        assert_eq!(
            next_wait(Duration::from_millis(50), None),
            Duration::from_millis(50)
        );
        assert_eq!(
            next_wait(Duration::from_millis(50), Some(400)),
            Duration::from_millis(400)
        );
        assert_eq!(
            next_wait(Duration::from_secs(2), Some(10)),
            Duration::from_secs(2)
        );
        assert_eq!(
            next_wait(Duration::from_millis(50), Some(u64::MAX)),
            TASK_POLL_HINT_MAX
        );
    }
}
