//! The small traits that let the generic layers (timeout, cancel, retry, breaker,
//! metrics) work over [`ToolRequest`] and other request types such as `http::Request`.

use std::time::Duration;

use http::Extensions;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    CallKind, CallTokens, ErrorKind, Provenance, RequestMeta, SlowCall, ToolRequest, ToolResponse,
};

/// What a generic layer needs to know about, and change on, a request.
pub trait ShieldRequest {
    /// The name the call is known by: the tool, or the host of an HTTP request. Breakers
    /// key on it by default; metrics label with it.
    fn tool(&self) -> &str;

    /// The name under which per-tool settings are looked up (a metrics label, say); the
    /// tool name unless the request type says otherwise
    /// ([`ToolRequest::settings_name`]).
    fn settings_name(&self) -> &str {
        self.tool()
    }

    /// The side-effect class.
    fn call_kind(&self) -> CallKind;

    /// The idempotency key, if the call carries one.
    fn get_idempotency_key(&self) -> Option<&str>;

    /// The caller's token for the whole call, if the request carries one.
    fn call_token(&self) -> Option<&CancellationToken>;

    /// The token of the current attempt (a child of the call token): what the tool
    /// watches, and what a timeout cancels.
    fn attempt_token(&self) -> Option<&CancellationToken>;

    /// Both tokens as one cheap handle (cloning it takes no lock), for layers that keep
    /// them beyond the call: the timeout's [`AttemptGuard`](crate::AttemptGuard), the
    /// cancel layer's watch. The default wraps [`call_token`](Self::call_token) and
    /// [`attempt_token`](Self::attempt_token) (one allocation); request types that can
    /// keep a [`CallTokens`] should return it.
    fn call_tokens(&self) -> Option<CallTokens> {
        match (self.call_token(), self.attempt_token()) {
            (Some(call), Some(attempt)) => {
                Some(CallTokens::from_parts(call.clone(), attempt.clone()))
            }
            (Some(call), None) => Some(CallTokens::from_parts(call.clone(), call.clone())),
            (None, Some(attempt)) => Some(CallTokens::from_parts(attempt.clone(), attempt.clone())),
            (None, None) => None,
        }
    }

    /// The deadline of the whole call.
    fn deadline_at(&self) -> Option<Instant>;

    /// Sets the deadline, keeping an earlier one already set.
    fn set_deadline(&mut self, deadline: Instant);

    /// The attempt number, starting at 1.
    fn attempt(&self) -> u32;

    /// Starts attempt `attempt` (fresh execution id, fresh attempt token).
    fn begin_attempt(&mut self, attempt: u32);

    /// Why the previous attempt failed: set by the retry layer on the copy it sends as the
    /// next attempt, `None` on a first attempt. The default keeps nothing.
    fn retry_reason(&self) -> Option<ErrorKind> {
        None
    }

    /// Records why the previous attempt failed (the retry layer calls it after
    /// [`begin_attempt`](Self::begin_attempt)). The default does nothing.
    fn set_retry_reason(&mut self, kind: ErrorKind) {
        let _ = kind;
    }

    /// Typed extensions.
    fn extensions(&self) -> &Extensions;

    /// Mutable typed extensions.
    fn extensions_mut(&mut self) -> &mut Extensions;

    /// Caller, trace and run ids, when the request type carries them (spans and logs use
    /// them). The default is `None`.
    fn request_meta(&self) -> Option<&RequestMeta> {
        None
    }
}

impl ShieldRequest for ToolRequest {
    fn tool(&self) -> &str {
        ToolRequest::tool(self)
    }
    fn settings_name(&self) -> &str {
        ToolRequest::settings_name(self)
    }
    fn call_kind(&self) -> CallKind {
        ToolRequest::call_kind(self)
    }
    fn get_idempotency_key(&self) -> Option<&str> {
        ToolRequest::get_idempotency_key(self)
    }
    fn call_token(&self) -> Option<&CancellationToken> {
        Some(ToolRequest::call_token(self))
    }
    fn attempt_token(&self) -> Option<&CancellationToken> {
        Some(ToolRequest::attempt_token(self))
    }
    fn call_tokens(&self) -> Option<CallTokens> {
        Some(ToolRequest::call_tokens(self).clone())
    }
    fn deadline_at(&self) -> Option<Instant> {
        ToolRequest::deadline_at(self)
    }
    fn set_deadline(&mut self, deadline: Instant) {
        ToolRequest::set_deadline(self, deadline)
    }
    fn attempt(&self) -> u32 {
        ToolRequest::attempt(self)
    }
    fn begin_attempt(&mut self, attempt: u32) {
        ToolRequest::begin_attempt(self, attempt)
    }
    fn retry_reason(&self) -> Option<ErrorKind> {
        ToolRequest::retry_reason(self)
    }
    fn set_retry_reason(&mut self, kind: ErrorKind) {
        ToolRequest::set_retry_reason(self, kind)
    }
    fn extensions(&self) -> &Extensions {
        ToolRequest::extensions(self)
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        ToolRequest::extensions_mut(self)
    }
    fn request_meta(&self) -> Option<&RequestMeta> {
        Some(ToolRequest::meta(self))
    }
}

/// A failure reported inside a successful response (an MCP `isError`, an HTTP 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InBandFailure {
    /// The kind the failure maps to.
    pub kind: ErrorKind,
    /// The wait the response asked for (an HTTP `Retry-After`).
    pub retry_after: Option<Duration>,
}

/// What a generic layer needs to know about, and change on, a response.
pub trait ShieldResponse {
    /// A failure the response carries in-band, if any.
    fn in_band_failure(&self) -> Option<InBandFailure>;

    /// Marks the response as a slow success.
    fn mark_slow(&mut self, slow: SlowCall);

    /// The slow-call mark, if the timeout layer left one.
    fn slow_call(&self) -> Option<SlowCall>;

    /// Records how many attempts the retry layer made for this response (1 when the
    /// first attempt succeeded). The default does nothing.
    fn set_attempts(&mut self, attempts: u32) {
        let _ = attempts;
    }

    /// The provenance, when the response type carries one (metrics read `cache_hit` and
    /// `replayed` from it). The default is `None`.
    fn provenance(&self) -> Option<&Provenance> {
        None
    }
}

impl ShieldResponse for ToolResponse {
    fn in_band_failure(&self) -> Option<InBandFailure> {
        self.is_error().then_some(InBandFailure {
            kind: ErrorKind::ExecutionFailed,
            retry_after: None,
        })
    }

    fn mark_slow(&mut self, slow: SlowCall) {
        self.provenance.slow = true;
        self.extensions.insert(slow);
    }

    fn slow_call(&self) -> Option<SlowCall> {
        self.extensions.get::<SlowCall>().copied()
    }

    fn set_attempts(&mut self, attempts: u32) {
        self.provenance.attempts = attempts;
    }

    fn provenance(&self) -> Option<&Provenance> {
        Some(&self.provenance)
    }
}

/// A tool implementation that can sit behind a router or in a fallback tier: a
/// cloneable, thread-safe `Service<ToolRequest>` whose future can move across threads.
///
/// Implemented for every service that qualifies; use it to spell the bound once.
pub trait ToolService:
    tower_service::Service<
        ToolRequest,
        Response = ToolResponse,
        Error = crate::ToolError,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> ToolService for S where
    S: tower_service::Service<
            ToolRequest,
            Response = ToolResponse,
            Error = crate::ToolError,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}
