//! Telling the server about abandoned work: `notifications/cancelled` for a `tools/call`
//! whose caller stopped waiting, `tasks/cancel` for a task nobody polls any more.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};

use rmcp::model::{
    CancelTaskParams, CancelTaskRequest, CancelledNotification, CancelledNotificationParam,
    ClientRequest, RequestId,
};
use rmcp::service::{PeerRequestOptions, RoleClient};
use rmcp::Peer;

/// The `reason` of the `notifications/cancelled` sent when the request's call or attempt
/// token fires while the client waits for the answer.
pub const REASON_CANCELLED: &str = "toolshield: call cancelled by the caller";

/// The `reason` of the `notifications/cancelled` sent when the call's future is dropped
/// before the answer: the attempt timeout or the total deadline fired, or the caller
/// dropped the call (a lost `select!`).
pub const REASON_ABANDONED: &str = "toolshield: call timed out or was abandoned";

/// Hands `send` to rmcp's outbound queue without waiting for the transport.
///
/// rmcp's `Peer` only offers async sends, and a `Drop` cannot await. The send's first
/// poll puts the message on the client's outbound channel when it has room (it holds
/// up to 1024 messages); the rest of the future only waits for the transport's write
/// report, which nobody needs here. Unconstrained so that an exhausted cooperative
/// budget of the current task cannot turn that first poll into `Pending`.
fn enqueue<F: Future>(send: F) {
    let send = pin!(tokio::task::coop::unconstrained(send));
    let mut cx = Context::from_waker(Waker::noop());
    let _ = send.poll(&mut cx);
}

/// Sends `notifications/cancelled` for one request, exactly once, unless disarmed.
///
/// Armed once the request is on its way; disarmed when an answer (a result or an error)
/// arrives. [`cancel`](Self::cancel) sends at once with [`REASON_CANCELLED`]; dropping it
/// armed sends with [`REASON_ABANDONED`].
#[must_use = "dropping the notice at once cancels the request"]
pub(crate) struct CancelNotice {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl CancelNotice {
    pub(crate) fn new(peer: Peer<RoleClient>, id: RequestId) -> Self {
        CancelNotice { peer, id: Some(id) }
    }

    /// The answer arrived: nothing to tell the server.
    pub(crate) fn disarm(&mut self) {
        self.id = None;
    }

    /// Sends the notice now with [`REASON_CANCELLED`] (once: later calls and the drop do
    /// nothing).
    pub(crate) fn cancel(&mut self) {
        self.send(REASON_CANCELLED);
    }

    fn send(&mut self, reason: &str) {
        let Some(id) = self.id.take() else {
            return;
        };
        let notification = CancelledNotification::new(CancelledNotificationParam::new(
            Some(id),
            Some(reason.to_owned()),
        ));
        enqueue(self.peer.send_notification(notification.into()));
    }
}

impl Drop for CancelNotice {
    fn drop(&mut self) {
        self.send(REASON_ABANDONED);
    }
}

/// Sends `tasks/cancel` for one task, once, unless disarmed (the task reached a terminal
/// status). The acknowledgement is not awaited: MCP task cancellation is cooperative and
/// the ack promises nothing.
#[must_use = "dropping the guard at once cancels the task"]
pub(crate) struct TaskCancel {
    peer: Peer<RoleClient>,
    task_id: Option<String>,
}

impl TaskCancel {
    pub(crate) fn new(peer: Peer<RoleClient>, task_id: String) -> Self {
        TaskCancel {
            peer,
            task_id: Some(task_id),
        }
    }

    /// The task ended on its own: nothing to cancel.
    pub(crate) fn disarm(&mut self) {
        self.task_id = None;
    }

    /// Asks the server to cancel the task now (once).
    pub(crate) fn cancel(&mut self) {
        let Some(task_id) = self.task_id.take() else {
            return;
        };
        let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
            CancelTaskParams::new(task_id),
        ));
        enqueue(
            self.peer
                .send_cancellable_request(request, PeerRequestOptions::no_options()),
        );
    }
}

impl Drop for TaskCancel {
    fn drop(&mut self) {
        self.cancel();
    }
}
