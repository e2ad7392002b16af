//! [`Resume`]: how a call records where its work can be picked up, and learns where to
//! pick it up from.
//!
//! A layer that guards a call with a durable claim (the idempotency layer) puts a
//! [`Resume`] handle on the call's [`CallState`](crate::CallState). The service that does
//! the work (an MCP adapter whose server answered with a long-running task) then
//!
//! - [`record`](Resume::record)s an opaque token as soon as the work has an identity of
//!   its own (the task id): the layer writes it next to the claim and the future resolves
//!   once it is written;
//! - asks [`resume_from`](Resume::resume_from) before starting: a call that took over the
//!   claim of a process that died gets the token that process recorded, and follows the
//!   existing work instead of starting it again.
//!
//! A call that no such layer guards has no handle: nothing is allocated and nothing is
//! recorded (`call_state().and_then(CallState::resume)` is `None`).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use toolshield_contract::{CallState, Resume, ResumeFuture, ResumeSink};
//!
//! /// A sink that keeps the token in memory (the idempotency layer writes it to its store).
//! #[derive(Default)]
//! struct Kept(Mutex<Option<String>>, Option<String>);
//!
//! impl ResumeSink for Kept {
//!     fn resume_from(&self) -> Option<&str> {
//!         self.1.as_deref()
//!     }
//!     fn record<'a>(&'a self, token: &'a str) -> ResumeFuture<'a> {
//!         *self.0.lock().unwrap() = Some(token.to_owned());
//!         Box::pin(std::future::ready(Ok(true)))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let sink = Arc::new(Kept::default());
//! let mut state = CallState::new();
//! assert!(state.resume().is_none(), "no layer, no handle");
//! state.set_resume(Some(Resume::new(sink.clone())));
//!
//! // what the service does, on its copy of the request
//! let resume = state.resume().expect("installed by the layer");
//! assert_eq!(resume.resume_from(), None, "a fresh claim: start the work");
//! assert!(resume.record("task-7").await.unwrap());
//! assert_eq!(sink.0.lock().unwrap().as_deref(), Some("task-7"));
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::ToolError;

/// The future of [`ResumeSink::record`]: `Ok(true)` once the token is written, `Ok(false)`
/// when the call no longer holds its claim (nothing written), an error when the token was
/// refused or could not be written.
pub type ResumeFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, ToolError>> + Send + 'a>>;

/// What a [`Resume`] handle is backed by: implemented by the layer that holds the call's
/// claim.
pub trait ResumeSink: Send + Sync + 'static {
    /// The token recorded by an earlier owner of the claim, when this call took it over;
    /// `None` for a call that starts the work.
    fn resume_from(&self) -> Option<&str>;

    /// Records `token` for the call's claim, replacing any earlier one, and resolves once
    /// it is written (see [`ResumeFuture`]).
    fn record<'a>(&'a self, token: &'a str) -> ResumeFuture<'a>;

    /// Told that an attempt of the call was handed to the service that does the work
    /// ([`Resume::mark_started`]): from then on the work may have started. The default
    /// ignores it.
    fn mark_started(&self) {}

    /// Told that a retry is about to send its first attempt
    /// ([`Resume::retry_begins`]): the sink remembers whether the work may have started
    /// before it. The default ignores it.
    fn retry_begins(&self) {}

    /// Told that the retry's last attempt ended with a failure showing it took no effect
    /// ([`Resume::attempt_refused`]): the work is as it was when the retry began. The
    /// default ignores it.
    fn attempt_refused(&self) {}
}

/// The per-call resume handle, part of a [`CallState`](crate::CallState) when a layer
/// installed one. Cheap to clone: every copy of the request (each retry attempt) shares
/// one sink.
#[derive(Clone)]
pub struct Resume {
    sink: Arc<dyn ResumeSink>,
}

impl Resume {
    /// A handle backed by `sink`.
    #[must_use]
    pub fn new(sink: Arc<dyn ResumeSink>) -> Self {
        Resume { sink }
    }

    /// The token to resume from: set when the call took over a claim whose earlier owner
    /// recorded one; `None` when the work is to be started.
    pub fn resume_from(&self) -> Option<&str> {
        self.sink.resume_from()
    }

    /// Records `token` so that a call taking the claim over later resumes from it; the
    /// future resolves once it is written (`Ok(true)`), or says why not.
    pub fn record<'a>(&'a self, token: &'a str) -> ResumeFuture<'a> {
        self.sink.record(token)
    }

    /// Tells the claim that an attempt of the call is being handed to the service that
    /// does the work, or to something that stands for it (a fallback tier, an injected
    /// fault): from then on the work may have started. A layer right above the service
    /// calls it as it passes each attempt on
    /// (`toolshield_provenance::AttemptProvenanceLayer` does, in every stack the shield
    /// builds); the claiming layer, told that the stack marks its attempts, then knows
    /// that a call dropped or cancelled before any mark ran nothing, and frees its key.
    pub fn mark_started(&self) {
        self.sink.mark_started();
    }

    /// Tells the claim that a retry is about to send the call's first attempt: whatever
    /// its attempts mark from now on, they can undo with
    /// [`attempt_refused`](Self::attempt_refused).
    pub fn retry_begins(&self) {
        self.sink.retry_begins();
    }

    /// Tells the claim that the retry's last attempt ended with a failure showing it
    /// took no effect (`CONNECTION_FAILED`, `UPSTREAM_UNAVAILABLE`, `RATE_LIMITED`,
    /// `OVERLOADED`: a refusal, which the idempotency layer also frees a key on): the
    /// marks made since [`retry_begins`](Self::retry_begins) are undone, as none of those
    /// attempts ran (with no `retry_begins` before it, nothing is undone). A mutation
    /// dropped while it waits to be tried again then frees its key.
    pub fn attempt_refused(&self) {
        self.sink.attempt_refused();
    }
}

impl fmt::Debug for Resume {
    // The token may name a remote resource: say only whether there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resume")
            .field("resuming", &self.sink.resume_from().is_some())
            .finish_non_exhaustive()
    }
}
