//! The two small traits the generic layers (timeout, deadline, cancel, retry, breaker,
//! metrics) ask of requests and responses. Every method has a default, so a type opts in
//! with one line and gets exactly what it can carry.

use std::sync::Arc;
use std::time::Duration;

use crate::{CallKind, CallState, ErrorKind};

/// Who made a call and under which trace, for spans and logs. Borrowed from the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallMeta<'a> {
    /// The caller (an agent, a user, a tenant).
    pub caller: Option<&'a str>,
    /// The distributed trace the call belongs to.
    pub trace_id: Option<&'a str>,
    /// The agent run the call belongs to.
    pub run_id: Option<&'a str>,
}

impl<'a> CallMeta<'a> {
    /// The ids of a call (each may be absent).
    #[must_use]
    pub fn new(
        caller: Option<&'a str>,
        trace_id: Option<&'a str>,
        run_id: Option<&'a str>,
    ) -> Self {
        CallMeta {
            caller,
            trace_id,
            run_id,
        }
    }
}

/// The caller, trace and run ids of a request whose type has no fields for them, kept in
/// its extensions: an `http::Request` reads them from there as its
/// [`call_meta`](ShieldRequest::call_meta), so the budget layer (per run or per caller)
/// and the metrics spans see them.
///
/// The application sets them from what it has authenticated, never from what the
/// request says of itself: a caller that picks its own id could move to a fresh budget
/// with every call. Each id is an `Arc<str>`, so a retry's or hedge's copy of the request
/// shares it.
///
/// ```
/// # #[cfg(feature = "http")] {
/// use toolshield_contract::{CallIds, ShieldRequest};
///
/// let mut req = http::Request::get("http://api.example.com/search").body(()).unwrap();
/// req.extensions_mut().insert(CallIds::new().run_id("run-7").caller("agent-a"));
/// assert_eq!(req.call_meta().run_id, Some("run-7"));
/// assert_eq!(req.call_meta().caller, Some("agent-a"));
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallIds {
    caller: Option<Arc<str>>,
    trace_id: Option<Arc<str>>,
    run_id: Option<Arc<str>>,
}

impl CallIds {
    /// No ids.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the caller (an agent, a user, a tenant).
    #[must_use]
    pub fn caller(mut self, caller: impl Into<Arc<str>>) -> Self {
        self.caller = Some(caller.into());
        self
    }

    /// Sets the distributed trace the call belongs to.
    #[must_use]
    pub fn trace_id(mut self, trace_id: impl Into<Arc<str>>) -> Self {
        self.trace_id = Some(trace_id.into());
        self
    }

    /// Sets the agent run the call belongs to.
    #[must_use]
    pub fn run_id(mut self, run_id: impl Into<Arc<str>>) -> Self {
        self.run_id = Some(run_id.into());
        self
    }

    /// The ids, borrowed, as [`ShieldRequest::call_meta`] gives them.
    #[must_use]
    pub fn meta(&self) -> CallMeta<'_> {
        CallMeta::new(
            self.caller.as_deref(),
            self.trace_id.as_deref(),
            self.run_id.as_deref(),
        )
    }
}

/// What a generic layer asks of a request: only what its concern needs, each with a
/// default, so any type can be a request.
///
/// | method | used by | when the type has none |
/// |---|---|---|
/// | [`call_state`](Self::call_state) / [`call_state_mut`](Self::call_state_mut) | timeout, deadline, cancel, retry, metrics | no deadline carried between layers, no cancellation tokens, attempts not numbered on the request |
/// | [`call_name`](Self::call_name) | breaker (default key), metrics (label) | the layer's own name |
/// | [`call_kind`](Self::call_kind) | retry (a mutation without a key is never repeated) | unknown: retried like an idempotent call, as tower's `Retry` does |
/// | [`call_idempotency_key`](Self::call_idempotency_key) | retry, hedge, idempotency (through [`idempotency_key_of`]: blank is none) | none |
/// | [`call_meta`](Self::call_meta) | metrics (span fields), budget (the run and caller it charges) | no ids |
/// | [`begin_attempt`](Self::begin_attempt) | retry | the state's, if any |
/// | [`renew_attempt`](Self::renew_attempt) | hedge, fallback | the state's, if any |
/// | [`attempt_id`](Self::attempt_id) | attempt provenance, fallback (the try a response names) | no id: nothing named |
///
/// Implemented for `ToolRequest` (every method), `http::Request<B>` (feature `http`: the
/// state lives in its extensions, the name is the host, the kind follows the method, the
/// key is the `Idempotency-Key` header), `serde_json::Value` (feature `serde_json`), and
/// for plain values with no per-call state: `String`, `&str`, `Box<str>`, `Arc<str>`,
/// `Vec<T>`, `bytes::Bytes`, `()`, `bool`, numbers and tuples of up to four of them.
/// Your own type opts in with one line (the defaults), or overrides what it can carry:
///
/// ```
/// use toolshield_contract::{CallKind, ShieldRequest};
///
/// #[derive(Clone)]
/// struct Query(String);
/// impl ShieldRequest for Query {}
///
/// #[derive(Clone)]
/// struct Transfer { amount: u64, key: String }
/// impl ShieldRequest for Transfer {
///     fn call_name(&self) -> Option<&str> { Some("transfer") }
///     fn call_kind(&self) -> Option<CallKind> { Some(CallKind::Mutating) }
///     fn call_idempotency_key(&self) -> Option<&str> { Some(&self.key) }
/// }
/// # let _ = (Query(String::new()), Transfer { amount: 1, key: "k".into() }.amount);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a request type the toolshield layers know",
    label = "`{Self}` does not implement `ShieldRequest`",
    note = "opt in with one line: `impl toolshield_contract::ShieldRequest for {Self} {{}}` (every method has a default); a foreign type needs a newtype, or the `http`/`serde_json` feature if it is one of those"
)]
pub trait ShieldRequest {
    /// The per-call state, if the request carries one.
    fn call_state(&self) -> Option<&CallState> {
        None
    }

    /// The per-call state, created on first use where the type has room for one; `None`
    /// where it has not (then deadlines and tokens are simply absent).
    fn call_state_mut(&mut self) -> Option<&mut CallState> {
        None
    }

    /// The name the call is known by: the tool, or the host of an HTTP request. The
    /// breaker keys on it by default and metrics label with it.
    fn call_name(&self) -> Option<&str> {
        None
    }

    /// The side-effect class, when the request knows it. The state's override
    /// ([`CallState::kind`]) comes first.
    fn call_kind(&self) -> Option<CallKind> {
        self.call_state().and_then(CallState::kind)
    }

    /// The idempotency key the call carries, if any. Layers read it through
    /// [`idempotency_key_of`], which takes a blank key for none.
    fn call_idempotency_key(&self) -> Option<&str> {
        None
    }

    /// Caller, trace and run ids, for spans and logs.
    fn call_meta(&self) -> CallMeta<'_> {
        CallMeta::default()
    }

    /// Starts attempt `attempt` on the copy the retry layer sends next: by default a
    /// fresh attempt token in the state ([`CallState::begin_attempt`]). A type with an id
    /// per attempt renews it here too.
    fn begin_attempt(&mut self, attempt: u32) {
        if let Some(state) = self.call_state_mut() {
            state.begin_attempt(attempt);
        }
    }

    /// Makes this copy another try at the call outside the retry's numbering: a hedge
    /// sent beside the attempt already running, a fallback tier after the primary
    /// failed. By default a fresh attempt token in the state
    /// ([`CallState::renew_attempt_token`]): the try is cancelled alone, and never
    /// inherits a token a timeout of another try cancelled. A type with an id per
    /// attempt renews it here too. The attempt number stays.
    fn renew_attempt(&mut self) {
        if let Some(state) = self.call_state_mut() {
            state.renew_attempt_token();
        }
    }

    /// The id of the current attempt, for a type that has one (`ToolRequest`'s execution
    /// id, as 16 bytes): what a layer that sent this try names on the response it
    /// produced ([`ShieldResponse::name_attempt`]). `None` by default.
    fn attempt_id(&self) -> Option<[u8; 16]> {
        None
    }
}

/// The idempotency key `req` carries, read by the one rule every layer applies: a key
/// that is empty or only whitespace is no key, and whitespace around a key is not part
/// of it (HTTP strips it from a header value: the server sees `" k1 "` as `k1`, so the
/// stack must dedupe on `k1` too).
///
/// The idempotency layer dedupes on this key (or derives one when it is `None`), retry
/// repeats a mutation only under it, hedging sends an idempotent call twice only under
/// it, and the HTTP adapter sends it as `Idempotency-Key`. A blank key read as a key
/// would make every keyless call of a tool one record, and repeat mutations that no
/// record guards.
///
/// ```
/// use toolshield_contract::{idempotency_key_of, ShieldRequest};
///
/// struct Transfer(&'static str);
/// impl ShieldRequest for Transfer {
///     fn call_idempotency_key(&self) -> Option<&str> { Some(self.0) }
/// }
/// assert_eq!(idempotency_key_of(&Transfer("order-1")), Some("order-1"));
/// assert_eq!(idempotency_key_of(&Transfer(" \t ")), None);
/// assert_eq!(idempotency_key_of(&Transfer("")), None);
/// assert_eq!(idempotency_key_of(&Transfer(" order-1\t")), Some("order-1"));
/// ```
#[inline]
pub fn idempotency_key_of<R: ShieldRequest + ?Sized>(req: &R) -> Option<&str> {
    req.call_idempotency_key()
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// A failure reported inside a successful response (an MCP `isError`, an HTTP 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InBandFailure {
    /// The kind the failure maps to.
    pub kind: ErrorKind,
    /// The wait the response asked for (an HTTP `Retry-After`).
    pub retry_after: Option<Duration>,
}

/// The mark the timeout layer leaves on a response that succeeded past the soft threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowCall {
    /// How long the attempt took.
    pub elapsed: Duration,
    /// The soft threshold it crossed.
    pub threshold: Duration,
}

/// The mark a hedging layer leaves on a response when it sent more than one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hedged {
    /// Which attempt answered: 1 for the first, 2 for the first hedge, and so on.
    pub answered_by: u32,
    /// How many attempts were sent in all (the first one included).
    pub sent: u32,
}

/// What a generic layer asks of a response; every method has a default.
///
/// Implemented for `ToolResponse`, `http::Response<B>` (feature `http`: the status is
/// classified, `Retry-After` read), `serde_json::Value` (feature `serde_json`) and the
/// plain types [`ShieldRequest`] lists. Your own type opts in with one line.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a response type the toolshield layers know",
    label = "`{Self}` does not implement `ShieldResponse`",
    note = "opt in with one line: `impl toolshield_contract::ShieldResponse for {Self} {{}}` (every method has a default)"
)]
pub trait ShieldResponse {
    /// A failure the response carries in-band, if any (counted by the breaker, retried
    /// by retry like an error of that kind).
    fn in_band_failure(&self) -> Option<InBandFailure> {
        None
    }

    /// Marks the response as a slow success. The default keeps no mark (the slow call is
    /// still logged and counted).
    fn mark_slow(&mut self, slow: SlowCall) {
        let _ = slow;
    }

    /// The slow-call mark, if the timeout layer left one.
    fn slow_call(&self) -> Option<SlowCall> {
        None
    }

    /// Records how many attempts the retry layer made (1 when the first one succeeded).
    fn set_attempts(&mut self, attempts: u32) {
        let _ = attempts;
    }

    /// How many attempts produced the response, when it says.
    fn attempts(&self) -> Option<u32> {
        None
    }

    /// Whether the response is a slow success: by default, whether it carries the
    /// timeout's mark.
    fn is_slow(&self) -> bool {
        self.slow_call().is_some()
    }

    /// How long the call took from its entry stamp
    /// ([`CallState::enter`](crate::CallState::enter)), if a layer inside already measured
    /// it (the provenance layer does, with the one clock read on the way out): an outer
    /// layer timing the call from the same stamp uses it instead of reading the clock
    /// again. The default: none.
    fn call_duration(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether the response was served from a cache (metrics count hits apart).
    fn cache_hit(&self) -> bool {
        false
    }

    /// Whether the response was replayed from an idempotency record.
    fn replayed(&self) -> bool {
        false
    }

    /// Marks the response as served by a fallback tier (`escalation` when the escalation
    /// hook supplied it). The default keeps no mark.
    fn mark_tier(&mut self, tier: &Arc<str>) {
        let _ = tier;
    }

    /// Names the attempt that produced the response ([`ShieldRequest::attempt_id`]),
    /// unless it names one already: the try closest to the tool knows best. The default
    /// keeps no name.
    fn name_attempt(&mut self, id: [u8; 16]) {
        let _ = id;
    }

    /// Whether the outcome could not be recorded for deduplication (an idempotency store
    /// that failed after the tool ran).
    fn unrecorded(&self) -> bool {
        false
    }

    /// Records that a hedging layer sent several attempts and which one answered. The
    /// default keeps no mark (the hedging layer still counts hedges in its stats).
    fn mark_hedged(&mut self, hedged: Hedged) {
        let _ = hedged;
    }

    /// A response that carries an in-band failure of `kind` (what
    /// [`in_band_failure`](Self::in_band_failure) then reports), built by a
    /// fault-injection layer; `None`, the default, where the type cannot carry one.
    fn in_band_failure_response(kind: ErrorKind, message: &str) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = (kind, message);
        None
    }
}

macro_rules! plain {
    ($($ty:ty),* $(,)?) => {
        $(
            impl ShieldRequest for $ty {}
            impl ShieldResponse for $ty {}
        )*
    };
}

plain!(
    String,
    &str,
    Box<str>,
    Arc<str>,
    bytes::Bytes,
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
);

impl<T> ShieldRequest for Vec<T> {}
impl<T> ShieldResponse for Vec<T> {}

macro_rules! tuples {
    ($(($($name:ident),+)),* $(,)?) => {
        $(
            impl<$($name),+> ShieldRequest for ($($name,)+) {}
            impl<$($name),+> ShieldResponse for ($($name,)+) {}
        )*
    };
}

tuples!((A), (A, B), (A, B, C), (A, B, C, D));

#[cfg(feature = "serde_json")]
plain!(serde_json::Value);
