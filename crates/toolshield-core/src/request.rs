use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::time;
use chrono::{DateTime, Utc};
use http::Extensions;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::canonical::{cache_key_from_digest, payload_digest, Digest};
use crate::{
    CallKind, CallMeta, CallState, CallTokens, ErrorKind, Progress, ProgressEvent, ShieldRequest,
    ToolError,
};

/// Who asked for a call and under which trace: shared by every clone of a request.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RequestMeta {
    /// The caller (an agent, a user, a tenant); namespaces cache and idempotency keys.
    pub caller_id: Option<Arc<str>>,
    /// The distributed trace this call belongs to.
    pub trace_id: Option<Arc<str>>,
    /// The agent run this call belongs to.
    pub run_id: Option<Arc<str>>,
    /// When the logical call was created (wall clock).
    pub started_at: DateTime<Utc>,
}

/// The payload and its digest, computed at most once for every clone of the request.
struct Payload {
    value: Value,
    digest: OnceLock<Result<Digest, ToolError>>,
}

/// A request's payload, shared with the request and every clone of it (one reference
/// count, no copy): what an in-memory store keeps beside a record so that a later call
/// can compare its payload with it before hashing anything.
///
/// Two payloads that are equal as JSON values have the same canonical digest, so
/// [`same_as`](Self::same_as) answering `true` settles a comparison; `false` does not
/// (`1` and `1.0` differ as values and are one canonical number): compare the digests
/// then.
///
/// ```
/// use serde_json::json;
/// use toolshield_core::ToolRequest;
///
/// let first = ToolRequest::new("pay", json!({"amount": 42, "to": "acct_1"}));
/// let kept = first.shared_payload();
/// let again = ToolRequest::new("pay", json!({"to": "acct_1", "amount": 42}));
/// assert!(kept.same_as(&again));
/// assert!(!kept.same_as(&ToolRequest::new("pay", json!({"amount": 43, "to": "acct_1"}))));
/// ```
#[derive(Clone)]
pub struct SharedPayload(Arc<Payload>);

impl SharedPayload {
    /// The payload.
    pub fn value(&self) -> &Value {
        &self.0.value
    }

    /// Whether `req` carries this payload: the same one (a clone of the request), or an
    /// equal JSON value.
    pub fn same_as(&self, req: &ToolRequest) -> bool {
        Arc::ptr_eq(&self.0, &req.shared.payload) || self.0.value == req.shared.payload.value
    }
}

impl PartialEq for SharedPayload {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.value == other.0.value
    }
}

impl fmt::Debug for SharedPayload {
    // The value is deliberately left out, as from `ToolRequest`'s: payload values must
    // never reach logs. The digest, once computed, tells payloads apart.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("SharedPayload");
        if let Some(Ok(digest)) = self.0.digest.get() {
            d.field("digest", digest);
        }
        d.finish_non_exhaustive()
    }
}

/// What every clone of a request shares, behind one `Arc`: cloning a request is one
/// reference-count increment. The rare changes (a builder call on a shared request, the
/// fresh attempt token of a retry) copy this small struct, never the payload.
#[derive(Clone)]
struct Shared {
    tool: Arc<str>,
    payload: Arc<Payload>,
    meta: RequestMeta,
}

/// A call of a tool: what to call, with what, of which side-effect class, under which
/// trace, cancellable, with an optional deadline.
///
/// Cloning is cheap: the tool name, payload, metadata and tokens sit behind one `Arc`, so
/// retry, cache and idempotency layers hold copies for one reference-count increment. The canonical payload
/// digest ([`payload_digest`](ToolRequest::payload_digest)) is computed once and shared
/// by every clone. Clones of a template sent as calls of their own share the caller's
/// call token and progress callback, never one call's attempt token or progress count:
/// the first layer to see a call gives a request that another copy still holds tokens
/// and a count of its own ([`CallState::own`](crate::CallState::own)).
///
/// # Cancellation
///
/// A request carries two tokens. The *call token* ([`call_token`](ToolRequest::call_token))
/// belongs to the caller: cancelling it cancels the whole call. The *attempt token*
/// ([`attempt_token`](ToolRequest::attempt_token)) is a child of it and is what the tool
/// should watch: a timeout or a dropped attempt cancels it without touching the caller's
/// token, and each retry gets a fresh one.
///
/// ```
/// use serde_json::json;
/// use toolshield_core::{CallKind, ToolRequest};
///
/// let req = ToolRequest::new("weather", json!({"city": "Paris"}))
///     .kind(CallKind::ReadOnly)
///     .caller("agent-7")
///     .trace_id("trace-1");
/// assert_eq!(req.tool(), "weather");
/// assert_eq!(req.meta().caller_id.as_deref(), Some("agent-7"));
/// ```
pub struct ToolRequest {
    shared: Arc<Shared>,
    // Tokens, deadline, attempt, retry reason, and the kind: `None` until the caller (or
    // the tool's configuration) declares it, which means `Mutating`.
    state: CallState,
    idempotency_key: Option<Arc<str>>,
    execution_id: Uuid,
    extensions: Extensions,
}

impl ToolRequest {
    /// A call of `tool` with `payload`, of kind [`CallKind::Mutating`] until told otherwise.
    #[must_use]
    pub fn new(tool: impl Into<Arc<str>>, payload: Value) -> Self {
        ToolRequest {
            shared: Arc::new(Shared {
                tool: tool.into(),
                payload: Arc::new(Payload {
                    value: payload,
                    digest: OnceLock::new(),
                }),
                meta: RequestMeta {
                    caller_id: None,
                    trace_id: None,
                    run_id: None,
                    started_at: Utc::now(),
                },
            }),
            state: CallState::new(),
            idempotency_key: None,
            execution_id: Uuid::new_v4(),
            extensions: Extensions::new(),
        }
    }

    // ----- builder -----

    /// Sets the side-effect class.
    #[must_use]
    pub fn kind(mut self, kind: CallKind) -> Self {
        self.state.set_kind(Some(kind));
        self
    }

    /// Sets the caller id.
    #[must_use]
    pub fn caller(mut self, caller_id: impl Into<Arc<str>>) -> Self {
        Arc::make_mut(&mut self.shared).meta.caller_id = Some(caller_id.into());
        self
    }

    /// Sets the trace id.
    #[must_use]
    pub fn trace_id(mut self, trace_id: impl Into<Arc<str>>) -> Self {
        Arc::make_mut(&mut self.shared).meta.trace_id = Some(trace_id.into());
        self
    }

    /// Sets the run id.
    #[must_use]
    pub fn run_id(mut self, run_id: impl Into<Arc<str>>) -> Self {
        Arc::make_mut(&mut self.shared).meta.run_id = Some(run_id.into());
        self
    }

    /// Sets the idempotency key (for `Mutating` calls: what makes them safe to retry).
    #[must_use]
    pub fn idempotency_key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Uses the caller's cancellation token; the tool will see a child of it.
    #[must_use]
    pub fn cancel_token(mut self, token: CancellationToken) -> Self {
        self.state.set_tokens(CallTokens::with_call(token));
        self
    }

    /// Sets a deadline for the whole call.
    #[must_use]
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.state.replace_deadline(Some(deadline));
        self
    }

    /// Calls `callback` with every progress report the tool makes, from every attempt
    /// (an agent UI's progress bar). Called on the reporting task: keep it quick, or
    /// forward the event to a channel.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use serde_json::json;
    /// use toolshield_core::ToolRequest;
    ///
    /// let seen = Arc::new(AtomicU64::new(0));
    /// let counter = Arc::clone(&seen);
    /// let req = ToolRequest::new("crawl", json!({}))
    ///     .on_progress(move |e| counter.store(e.seq, Ordering::Relaxed));
    /// req.progress().report(1.0, 4.0, Some("page 1"));
    /// assert_eq!(seen.load(Ordering::Relaxed), 1);
    /// ```
    #[must_use]
    pub fn on_progress<F>(mut self, callback: F) -> Self
    where
        F: Fn(&ProgressEvent<'_>) + Send + Sync + 'static,
    {
        let progress = std::mem::take(self.state.progress_mut()).on_progress(callback);
        *self.state.progress_mut() = progress;
        self
    }

    /// Adds a typed extension.
    #[must_use]
    pub fn extension<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.extensions.insert(value);
        self
    }

    // ----- accessors -----

    /// The tool name.
    pub fn tool(&self) -> &str {
        &self.shared.tool
    }

    /// The tool name, shared.
    pub fn tool_arc(&self) -> &Arc<str> {
        &self.shared.tool
    }

    /// The payload (the tool's arguments).
    pub fn payload(&self) -> &Value {
        &self.shared.payload.value
    }

    /// The payload as a handle shared with this request (no copy): see [`SharedPayload`].
    pub fn shared_payload(&self) -> SharedPayload {
        SharedPayload(Arc::clone(&self.shared.payload))
    }

    /// The side-effect class.
    pub fn call_kind(&self) -> CallKind {
        self.state.kind().unwrap_or_default()
    }

    /// The side-effect class the request declares, if any (without one it is treated as
    /// [`CallKind::Mutating`]).
    ///
    /// ```
    /// use serde_json::json;
    /// use toolshield_core::{CallKind, ToolRequest};
    ///
    /// let req = ToolRequest::new("lookup", json!({}));
    /// assert_eq!(req.declared_kind(), None);
    /// assert_eq!(req.call_kind(), CallKind::Mutating);
    ///
    /// let mut req = req.kind(CallKind::ReadOnly);
    /// req.apply_tool_kind(CallKind::Idempotent);
    /// assert_eq!(req.declared_kind(), Some(CallKind::Idempotent), "the stricter of the two");
    /// ```
    pub fn declared_kind(&self) -> Option<CallKind> {
        self.state.kind()
    }

    /// Applies the side-effect class a tool is configured with: a request that declares
    /// none takes `kind`; one that declares another keeps the stricter of the two
    /// ([`CallKind::stricter`]), so neither side can make a call less safe.
    pub fn apply_tool_kind(&mut self, kind: CallKind) {
        let kind = match self.state.kind() {
            Some(declared) => declared.stricter(kind),
            None => kind,
        };
        self.state.set_kind(Some(kind));
    }

    /// The idempotency key, given or derived.
    pub fn get_idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// Sets (or clears) the idempotency key in place; the idempotency layer uses this to
    /// attach a derived key.
    pub fn set_idempotency_key(&mut self, key: Option<Arc<str>>) {
        self.idempotency_key = key;
    }

    /// The id of the current attempt (UUID v4, renewed by [`begin_attempt`](Self::begin_attempt),
    /// and by [`ShieldRequest::renew_attempt`] for a hedge or a fallback tier).
    pub fn execution_id(&self) -> Uuid {
        self.execution_id
    }

    /// The attempt number, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.state.attempt()
    }

    /// Why the previous attempt failed (set by the retry layer on every attempt after the
    /// first); `None` on a first attempt.
    pub fn retry_reason(&self) -> Option<ErrorKind> {
        self.state.retry_reason()
    }

    /// Records why the previous attempt failed.
    pub fn set_retry_reason(&mut self, kind: ErrorKind) {
        self.state.set_retry_reason(Some(kind));
    }

    /// The per-call state: tokens, deadline, attempt, retry reason, declared kind.
    pub fn state(&self) -> &CallState {
        &self.state
    }

    /// The progress handle: a long tool reports on it
    /// ([`Progress::report`], [`Progress::heartbeat`]).
    pub fn progress(&self) -> &Progress {
        self.state.progress()
    }

    /// Caller, trace, run and start time.
    pub fn meta(&self) -> &RequestMeta {
        &self.shared.meta
    }

    /// The call token: cancelling it cancels the whole call.
    pub fn call_token(&self) -> &CancellationToken {
        self.state.tokens().call()
    }

    /// The attempt token: the child token the tool watches.
    pub fn attempt_token(&self) -> &CancellationToken {
        self.state.tokens().attempt()
    }

    /// Both tokens, behind one `Arc` (cloning it takes no lock).
    pub fn call_tokens(&self) -> &CallTokens {
        self.state.tokens()
    }

    /// Whether the caller has cancelled the call.
    pub fn is_cancelled(&self) -> bool {
        self.state.tokens().call().is_cancelled()
    }

    /// The deadline of the whole call, if any.
    pub fn deadline_at(&self) -> Option<Instant> {
        self.state.deadline()
    }

    /// Sets the deadline, keeping an earlier one already set.
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.state.set_deadline(deadline);
    }

    /// Time left before the deadline (zero once passed), or `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.state
            .deadline()
            .map(|d| d.saturating_duration_since(time::now()))
    }

    /// The typed extensions layers attach to the request.
    pub fn extensions(&self) -> &Extensions {
        &self.extensions
    }

    /// Mutable access to the extensions.
    pub fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.extensions
    }

    /// SHA-256 of the RFC 8785 canonical payload, computed once and shared by every clone.
    pub fn payload_digest(&self) -> Result<Digest, ToolError> {
        let payload = &self.shared.payload;
        payload
            .digest
            .get_or_init(|| payload_digest(&payload.value))
            .clone()
    }

    /// `{tool}:{payload digest}`, the cache key (docs/cache.md).
    pub fn cache_key(&self) -> Result<String, ToolError> {
        Ok(cache_key_from_digest(self.tool(), &self.payload_digest()?))
    }

    /// Starts attempt number `attempt`: a fresh execution id, and from the second attempt
    /// on a fresh attempt token (the previous one may have been cancelled by a timeout).
    pub fn begin_attempt(&mut self, attempt: u32) {
        self.state.begin_attempt(attempt);
        self.execution_id = Uuid::new_v4();
    }
}

/// A clone made inside a call (a retry's copy, a hedge) keeps the call's execution id
/// until its attempt begins; a clone of a request no layer has seen yet (a template) is
/// another call, with an execution id of its own.
impl Clone for ToolRequest {
    fn clone(&self) -> Self {
        ToolRequest {
            shared: Arc::clone(&self.shared),
            state: self.state.clone(),
            idempotency_key: self.idempotency_key.clone(),
            execution_id: if self.state.is_owned() {
                self.execution_id
            } else {
                Uuid::new_v4()
            },
            extensions: self.extensions.clone(),
        }
    }
}

impl fmt::Debug for ToolRequest {
    // The payload is deliberately left out: payload values must never reach logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRequest")
            .field("tool", &self.shared.tool)
            .field("kind", &self.call_kind())
            .field("execution_id", &self.execution_id)
            .field("attempt", &self.state.attempt())
            .field("has_idempotency_key", &self.idempotency_key.is_some())
            .field("trace_id", &self.shared.meta.trace_id)
            .field("deadline", &self.state.deadline())
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl ShieldRequest for ToolRequest {
    fn call_state(&self) -> Option<&CallState> {
        Some(&self.state)
    }
    fn call_state_mut(&mut self) -> Option<&mut CallState> {
        Some(&mut self.state)
    }
    fn call_name(&self) -> Option<&str> {
        Some(self.tool())
    }
    fn call_kind(&self) -> Option<CallKind> {
        Some(ToolRequest::call_kind(self))
    }
    fn call_idempotency_key(&self) -> Option<&str> {
        self.get_idempotency_key()
    }
    fn call_meta(&self) -> CallMeta<'_> {
        let meta = &self.shared.meta;
        CallMeta::new(
            meta.caller_id.as_deref(),
            meta.trace_id.as_deref(),
            meta.run_id.as_deref(),
        )
    }
    fn begin_attempt(&mut self, attempt: u32) {
        ToolRequest::begin_attempt(self, attempt);
    }
    fn renew_attempt(&mut self) {
        self.state.renew_attempt_token();
        self.execution_id = Uuid::new_v4();
    }
    fn attempt_id(&self) -> Option<[u8; 16]> {
        Some(*self.execution_id.as_bytes())
    }
}
