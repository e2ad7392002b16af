use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The closed set of canonical error codes.
///
/// Each kind has a stable string ([`ErrorKind::code`]) that appears in metrics, logs,
/// the `toolshield_core::ToolResult` envelope and the admin API, and knows whether
/// it may be retried ([`ErrorKind::is_retriable`]) and whether it counts as a failure
/// for a circuit breaker ([`ErrorKind::counts_for_breaker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "SCREAMING_SNAKE_CASE"))]
#[non_exhaustive]
pub enum ErrorKind {
    /// The attempt or the whole call ran out of time.
    Timeout,
    /// The tool refused the call for now (HTTP 429).
    RateLimited,
    /// The circuit breaker for the tool is open; the tool was not called.
    CircuitOpen,
    /// The caller cancelled the call.
    Cancelled,
    /// The arguments are wrong; calling again with the same arguments will fail again.
    InvalidInput,
    /// The credentials are missing or refused.
    Unauthorized,
    /// The tool, or what it was asked for, does not exist.
    NotFound,
    /// The tool could not be reached.
    ConnectionFailed,
    /// The tool answered that it is unavailable (HTTP 502, 503, 504).
    UpstreamUnavailable,
    /// The tool ran and failed.
    ExecutionFailed,
    /// Another call with the same idempotency key is still running.
    InProgress,
    /// The idempotency key was used before with another payload.
    IdempotencyKeyReused,
    /// A mutating call was sent but its result was lost; it may or may not have happened.
    OutcomeUnknown,
    /// A store (idempotency, cache) could not be reached.
    StoreUnavailable,
    /// A defect inside toolshield.
    Internal,
    /// Too many calls in flight: the call was turned away before it started (tower's
    /// `LoadShed`, a full bulkhead). Retriable; says nothing about the tool's health.
    Overloaded,
    /// The agent run (or caller) has used up its call budget for the tool, or in total.
    /// Never retried, never a breaker failure: the model should stop calling the tool and
    /// answer with what it has.
    BudgetExhausted,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::Timeout,
        ErrorKind::RateLimited,
        ErrorKind::CircuitOpen,
        ErrorKind::Cancelled,
        ErrorKind::InvalidInput,
        ErrorKind::Unauthorized,
        ErrorKind::NotFound,
        ErrorKind::ConnectionFailed,
        ErrorKind::UpstreamUnavailable,
        ErrorKind::ExecutionFailed,
        ErrorKind::InProgress,
        ErrorKind::IdempotencyKeyReused,
        ErrorKind::OutcomeUnknown,
        ErrorKind::StoreUnavailable,
        ErrorKind::Internal,
        ErrorKind::Overloaded,
        ErrorKind::BudgetExhausted,
    ];

    /// The stable code, e.g. `RATE_LIMITED`.
    pub const fn code(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "TIMEOUT",
            ErrorKind::RateLimited => "RATE_LIMITED",
            ErrorKind::CircuitOpen => "CIRCUIT_OPEN",
            ErrorKind::Cancelled => "CANCELLED",
            ErrorKind::InvalidInput => "INVALID_INPUT",
            ErrorKind::Unauthorized => "UNAUTHORIZED",
            ErrorKind::NotFound => "NOT_FOUND",
            ErrorKind::ConnectionFailed => "CONNECTION_FAILED",
            ErrorKind::UpstreamUnavailable => "UPSTREAM_UNAVAILABLE",
            ErrorKind::ExecutionFailed => "EXECUTION_FAILED",
            ErrorKind::InProgress => "IN_PROGRESS",
            ErrorKind::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            ErrorKind::OutcomeUnknown => "OUTCOME_UNKNOWN",
            ErrorKind::StoreUnavailable => "STORE_UNAVAILABLE",
            ErrorKind::Internal => "INTERNAL",
            ErrorKind::Overloaded => "OVERLOADED",
            ErrorKind::BudgetExhausted => "BUDGET_EXHAUSTED",
        }
    }

    /// Parses a stable code back into its kind.
    pub fn from_code(code: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// Whether calling again may succeed: timeouts, rate limits, connection failures and
    /// upstream unavailability. Everything else fails the same way when repeated, or must
    /// not be repeated (`OUTCOME_UNKNOWN`).
    pub const fn is_retriable(self) -> bool {
        matches!(
            self,
            ErrorKind::Timeout
                | ErrorKind::RateLimited
                | ErrorKind::ConnectionFailed
                | ErrorKind::UpstreamUnavailable
                | ErrorKind::Overloaded
        )
    }

    /// Whether a call that failed with this kind may still have taken effect at the tool:
    /// a timeout after the call was sent (`TIMEOUT`), an outcome already unknown
    /// (`OUTCOME_UNKNOWN`), or a failure inside the tool layer, such as a caught panic
    /// (`INTERNAL`). A `Mutating` call that failed so is never repeated, key or not: it
    /// ends `OUTCOME_UNKNOWN` under an idempotency key.
    ///
    /// ```
    /// use toolshield_contract::ErrorKind;
    ///
    /// assert!(ErrorKind::Timeout.may_have_taken_effect());
    /// assert!(!ErrorKind::ConnectionFailed.may_have_taken_effect());
    /// ```
    pub const fn may_have_taken_effect(self) -> bool {
        matches!(
            self,
            ErrorKind::Timeout | ErrorKind::OutcomeUnknown | ErrorKind::Internal
        )
    }

    /// Whether this error says something about the tool's health, so a circuit breaker
    /// counts it as a failure. Client errors, cancellations and toolshield's own
    /// rejections never count; `RATE_LIMITED` and `UNAUTHORIZED` do.
    pub const fn counts_for_breaker(self) -> bool {
        matches!(
            self,
            ErrorKind::Timeout
                | ErrorKind::RateLimited
                | ErrorKind::Unauthorized
                | ErrorKind::ConnectionFailed
                | ErrorKind::UpstreamUnavailable
                | ErrorKind::ExecutionFailed
        )
    }

    /// The short sentence a language model reads about a failed call of `tool`.
    ///
    /// The tool name may come from a remote server: it is shown on one line (control
    /// characters and line separators become spaces) and cut to [`MAX_TOOL_NAME_SHOWN`]
    /// bytes.
    pub fn for_model(self, tool: &str) -> String {
        let tool = &*printable(tool, MAX_TOOL_NAME_SHOWN);
        match self {
            ErrorKind::Timeout => format!("The tool `{tool}` took too long to answer. Try again later, or continue without it."),
            ErrorKind::RateLimited => format!("The tool `{tool}` is rate limited. Wait before calling it again."),
            ErrorKind::CircuitOpen => format!("The tool `{tool}` is unavailable right now. Use another approach or another tool."),
            ErrorKind::Cancelled => format!("The call to `{tool}` was cancelled. Do not retry it unless asked to."),
            ErrorKind::InvalidInput => format!("The arguments for `{tool}` are invalid. Fix the arguments and call it again."),
            ErrorKind::Unauthorized => format!("Access to `{tool}` was refused. Do not retry; ask the user to check the credentials."),
            ErrorKind::NotFound => format!("The tool `{tool}` or the thing it was asked for does not exist. Check the name and arguments."),
            ErrorKind::ConnectionFailed => format!("The tool `{tool}` could not be reached. Try again later, or use another tool."),
            ErrorKind::UpstreamUnavailable => format!("The service behind `{tool}` is unavailable. Try again later, or use another tool."),
            ErrorKind::ExecutionFailed => format!("The tool `{tool}` failed. Check the arguments, or use another approach."),
            ErrorKind::InProgress => format!("The same call to `{tool}` is still running. Wait for it instead of calling again."),
            ErrorKind::IdempotencyKeyReused => format!("The idempotency key for `{tool}` was already used with other arguments. Use a new key for a new action."),
            ErrorKind::OutcomeUnknown => format!("The call to `{tool}` may or may not have taken effect. Check its effect before calling again."),
            ErrorKind::StoreUnavailable => format!("The tool `{tool}` cannot be called safely right now. Try again later."),
            ErrorKind::Internal => format!("The call to `{tool}` failed inside the tool layer. Try again later, or use another approach."),
            ErrorKind::Overloaded => format!("The tool `{tool}` is busy with other calls. Try again in a moment, or use another tool."),
            ErrorKind::BudgetExhausted => format!("The call budget for `{tool}` in this run is used up. Do not call `{tool}` again; answer with the information you already have."),
        }
    }
}

/// At most this many bytes of a tool's name are shown in a [`ErrorKind::for_model`] text.
pub const MAX_TOOL_NAME_SHOWN: usize = 128;

/// Whether `c` would break a text out of its line, or make what a person sees differ
/// from what a model reads: a control character (newlines, escapes, NUL), a Unicode line
/// or paragraph separator, a bidirectional control (which reorders the text around it on
/// screen, as in CVE-2021-42574), an invisible space or word joiner, or a tag character
/// (U+E0000 to U+E007F: invisible, yet read by models as the ASCII they mirror).
pub fn breaks_a_line(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061C}'
                | '\u{200B}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
                | '\u{E0000}'..='\u{E007F}'
        )
}

/// `text` on one line and at most `max` bytes, for a model or a log to read: every
/// control character and line separator becomes a space (as do the bidirectional
/// controls, invisible spaces and tag characters, which would make what a person reads
/// differ from what a model reads), and a longer text is cut at a
/// character boundary and ends with `…` (within the `max` bytes). Borrowed when `text`
/// needs neither.
///
/// ```
/// use toolshield_contract::printable;
///
/// assert_eq!(printable("plain", 64), "plain");
/// assert_eq!(printable("two\nlines\u{1b}[0m", 64), "two lines [0m");
/// let long = "x".repeat(100);
/// let cut = printable(&long, 10);
/// assert!(cut.len() <= 10 && cut.ends_with('…'));
/// ```
pub fn printable(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max && !text.chars().any(breaks_a_line) {
        return Cow::Borrowed(text);
    }
    const ELLIPSIS: char = '…';
    let budget = if text.len() > max {
        max.saturating_sub(ELLIPSIS.len_utf8())
    } else {
        max
    };
    let mut out = String::with_capacity(budget.min(text.len()) + ELLIPSIS.len_utf8());
    let mut cut = false;
    for c in text.chars() {
        let c = if breaks_a_line(c) { ' ' } else { c };
        if out.len() + c.len_utf8() > budget {
            cut = true;
            break;
        }
        out.push(c);
    }
    if cut && max >= ELLIPSIS.len_utf8() {
        out.push(ELLIPSIS);
    }
    Cow::Owned(out)
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// The one error type of the stack.
///
/// Small: its kind, attempts and message inline, the rest (the wait, the elapsed time,
/// the provenance, the source) in a box made on the first write of any of it, so the
/// `Result` every layer moves is no larger than the response, and an error with only a
/// kind and a message allocates nothing (unless its message does). Cheap to clone (at
/// most one small allocation; the source is behind an `Arc`), so a cache, a
/// single-flight group or an idempotency record can hand the same error to many callers.
#[derive(Clone)]
pub struct ToolError {
    kind: ErrorKind,
    attempts: u32,
    message: Cow<'static, str>,
    details: Option<Box<Details>>,
}

/// What a [`ToolError`] holds besides its kind, attempts and message.
#[derive(Clone, Default)]
struct Details {
    retry_after: Option<Duration>,
    elapsed: Option<Duration>,
    // The provenance of a failure, as the provenance layer stamps it: the tool called and
    // the source behind it. `Arc`s shared with the stack: stamping copies no string.
    tool: Option<Arc<str>>,
    origin: Option<Arc<str>>,
    source: Option<Arc<dyn StdError + Send + Sync + 'static>>,
    // Made by `from_boxed` from an error of another type: the message is that error's
    // text, written for its author, not for a caller.
    foreign: bool,
}

impl ToolError {
    /// An error of `kind` with a short lowercase message.
    #[must_use]
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        ToolError {
            kind,
            attempts: 0,
            message: message.into(),
            details: None,
        }
    }

    /// The details, boxed on the first write.
    fn details_mut(&mut self) -> &mut Details {
        self.details.get_or_insert_with(Box::default)
    }

    /// The details, if any was written.
    fn details(&self) -> Option<&Details> {
        self.details.as_deref()
    }

    /// `TIMEOUT`.
    #[must_use]
    pub fn timeout(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    /// `CANCELLED`.
    #[must_use]
    pub fn cancelled(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Cancelled, message)
    }

    /// `INVALID_INPUT`.
    #[must_use]
    pub fn invalid_input(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// `RATE_LIMITED`, with the wait the tool asked for, if it said.
    #[must_use]
    pub fn rate_limited(
        message: impl Into<Cow<'static, str>>,
        retry_after: Option<Duration>,
    ) -> Self {
        let e = Self::new(ErrorKind::RateLimited, message);
        match retry_after {
            Some(wait) => e.with_retry_after(wait),
            None => e,
        }
    }

    /// `EXECUTION_FAILED`.
    #[must_use]
    pub fn execution_failed(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::ExecutionFailed, message)
    }

    /// `INTERNAL`.
    #[must_use]
    pub fn internal(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// Wraps another error as `kind`, keeping it as the [`source`](StdError::source). The
    /// message is the error's text, at most [`MAX_SOURCE_MESSAGE`] bytes.
    #[must_use]
    pub fn from_source<E>(kind: ErrorKind, source: E) -> Self
    where
        E: StdError + Send + Sync + 'static,
    {
        let message = source_text(&source);
        Self::new(kind, message).with_source(source)
    }

    /// Sets the source error.
    #[must_use]
    pub fn with_source<E>(mut self, source: E) -> Self
    where
        E: StdError + Send + Sync + 'static,
    {
        self.details_mut().source = Some(Arc::new(source));
        self
    }

    /// Whether this error was made from an error of another type: [`from_boxed`]
    /// (and so [`IntoToolError`]) found no `ToolError` in it, and its message is that
    /// error's text, written for its author (a driver's error may name hosts, databases or
    /// credentials). An edge that answers a remote client shows such a message only in
    /// its own logs ([`toolshield-axum`'s `error_response`] does).
    ///
    /// [`from_boxed`]: ToolError::from_boxed
    /// [`toolshield-axum`'s `error_response`]: https://docs.rs/toolshield-axum
    pub fn is_foreign(&self) -> bool {
        self.details().is_some_and(|d| d.foreign)
    }

    /// Sets how long the caller should wait before calling again.
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.details_mut().retry_after = Some(retry_after);
        self
    }

    /// Records, in place, how many attempts were made before this error was returned.
    pub fn set_attempts(&mut self, attempts: u32) {
        self.attempts = attempts;
    }

    /// Records how many attempts were made before this error was returned.
    #[must_use]
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// Records how long the call ran before this error was returned.
    #[must_use]
    pub fn with_elapsed(mut self, elapsed: Duration) -> Self {
        self.details_mut().elapsed = Some(elapsed);
        self
    }

    /// Records the tool that was called and the source behind it (the tool, server or URL
    /// its provenance names), as the provenance layer does for every failure it sees, so
    /// the `ToolResult` envelope of an error names them as a success's does.
    #[must_use]
    pub fn with_provenance(mut self, tool: Arc<str>, source: Arc<str>) -> Self {
        let details = self.details_mut();
        details.tool = Some(tool);
        details.origin = Some(source);
        self
    }

    /// The tool that was called, when a layer recorded it
    /// ([`with_provenance`](Self::with_provenance)).
    pub fn provenance_tool(&self) -> Option<&Arc<str>> {
        self.details().and_then(|d| d.tool.as_ref())
    }

    /// The source behind the tool (its provenance `source`), when a layer recorded it.
    pub fn provenance_source(&self) -> Option<&Arc<str>> {
        self.details().and_then(|d| d.origin.as_ref())
    }

    /// The canonical kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The stable code of the kind.
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// The message, without the code.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// How long to wait before calling again, when the tool or a layer said so.
    pub fn retry_after(&self) -> Option<Duration> {
        self.details().and_then(|d| d.retry_after)
    }

    /// The attempts made before this error (0 when no layer recorded it).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How long the call ran, when a layer recorded it.
    pub fn elapsed(&self) -> Option<Duration> {
        self.details().and_then(|d| d.elapsed)
    }

    /// Shorthand for `self.kind().is_retriable()`.
    pub fn is_retriable(&self) -> bool {
        self.kind.is_retriable()
    }

    /// Shorthand for `self.kind().counts_for_breaker()`.
    pub fn counts_for_breaker(&self) -> bool {
        self.kind.counts_for_breaker()
    }

    /// The short, actionable text a language model reads about this failure of `tool`.
    ///
    /// It never contains the raw message (which may hold upstream details); a rate limit
    /// with a known wait says how long.
    pub fn for_model(&self, tool: &str) -> String {
        match (self.kind, self.retry_after()) {
            (ErrorKind::RateLimited, Some(wait)) => {
                let tool = &*printable(tool, MAX_TOOL_NAME_SHOWN);
                // Rounded up: told "6" after a 6.5 s wait, the model would come back early
                // and be refused again.
                // Saturating: a wait of `Duration::MAX` must not overflow.
                let secs = wait
                    .as_secs()
                    .saturating_add(u64::from(wait.subsec_nanos() > 0))
                    .max(1);
                let unit = if secs == 1 { "second" } else { "seconds" };
                format!(
                    "The tool `{tool}` is rate limited. Wait {secs} {unit} before calling it again."
                )
            }
            (kind, _) => kind.for_model(tool),
        }
    }
}

impl fmt::Debug for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ToolError");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(r) = self.retry_after() {
            d.field("retry_after", &r);
        }
        if self.attempts > 0 {
            d.field("attempts", &self.attempts);
        }
        if let Some(tool) = self.provenance_tool() {
            d.field("tool", tool);
        }
        if let Some(source) = self.details().and_then(|details| details.source.as_ref()) {
            d.field("source", source);
        }
        d.finish()
    }
}

/// `CODE: message`, on one line: a message may come from a tool or a server behind it,
/// and a newline or an escape sequence in it must not forge a log line. Every control
/// character and line separator is shown as a space ([`message`](ToolError::message)
/// keeps the text as it came).
impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.code())?;
        f.write_str(": ")?;
        let mut rest = &*self.message;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| breaks_a_line(c)) {
            f.write_str(&rest[..at])?;
            f.write_str(" ")?;
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

impl StdError for ToolError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.details()
            .and_then(|d| d.source.as_deref())
            .map(|e| e as &(dyn StdError + 'static))
    }
}

impl ToolError {
    /// Classifies a boxed error from an inner service (tower middleware, hyper, reqwest)
    /// by what it holds, looking down its chain of sources:
    ///
    /// | found | kind |
    /// |---|---|
    /// | a `ToolError` (boxed by tower's `Buffer`, say) | that error, unchanged |
    /// | tower's `timeout::error::Elapsed`, tokio's `time::error::Elapsed` | `TIMEOUT` |
    /// | tower's `load_shed::error::Overloaded` | `OVERLOADED` |
    /// | a `std::io::Error` | by its kind: refused, reset, aborted, broken pipe `CONNECTION_FAILED`, timed out `TIMEOUT`, ... |
    /// | anything else | `EXECUTION_FAILED` |
    ///
    /// The chain is read at most [`MAX_SOURCE_DEPTH`] links deep, and the message is the
    /// error's text, at most [`MAX_SOURCE_MESSAGE`] bytes.
    ///
    /// The error is kept as the source. To classify your own errors differently, turn
    /// them into a `ToolError` before they reach a layer (tower's `MapErr` innermost):
    /// the layers take an inner error through [`IntoToolError`], which comes here for
    /// anything but a `ToolError`.
    pub fn from_boxed(error: crate::BoxError) -> ToolError {
        let error = match error.downcast::<ToolError>() {
            Ok(tool_error) => return *tool_error,
            Err(error) => error,
        };
        // A serde_json error has its own conversion, which keeps payload values out of
        // the message.
        #[cfg(feature = "serde_json")]
        let error = match error.downcast::<serde_json::Error>() {
            Ok(json) => return ToolError::from(*json),
            Err(error) => error,
        };
        let mut kind = ErrorKind::ExecutionFailed;
        let mut current: Option<&(dyn StdError + 'static)> = Some(&*error);
        // At most `MAX_SOURCE_DEPTH` links: an error whose `source()` leads back to itself
        // must not hold the call forever.
        let mut depth = 0;
        while let Some(e) = current {
            depth += 1;
            if depth > MAX_SOURCE_DEPTH {
                break;
            }
            if let Some(inner) = e.downcast_ref::<ToolError>() {
                return inner.clone();
            }
            if e.is::<tower::timeout::error::Elapsed>() || e.is::<tokio::time::error::Elapsed>() {
                kind = ErrorKind::Timeout;
                break;
            }
            if e.is::<tower::load_shed::error::Overloaded>() {
                kind = ErrorKind::Overloaded;
                break;
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                kind = io_kind(io.kind());
                break;
            }
            current = e.source();
        }
        ToolError {
            kind,
            attempts: 0,
            message: Cow::Owned(source_text(&*error)),
            details: Some(Box::new(Details {
                source: Some(Arc::from(error)),
                foreign: true,
                ..Details::default()
            })),
        }
    }
}

/// An inner service's error, as the layers take it: anything tower's own middleware
/// accepts (`Into<BoxError>`: every `std::error::Error + Send + Sync`, `String`, `&str`,
/// tower's `BoxError`), so a layer stacks onto a hyper client, an axum route or
/// a `service_fn` with no `map_err` in between.
///
/// Implemented for every such type; not implemented by hand. A [`ToolError`] is passed
/// through as it is, with no allocation (a layer's error reaching the next layer out
/// costs nothing); anything else is boxed and classified by [`ToolError::from_boxed`]
/// (tower's `Elapsed` is `TIMEOUT`, an `io::Error` by its kind, a `ToolError` found down
/// the chain of sources is that error, the rest `EXECUTION_FAILED`). To classify your own
/// error type differently, turn it into a `ToolError` innermost (tower's `MapErr`, or
/// `map_err` on the `service_fn`'s future).
///
/// ```
/// use toolshield_contract::{ErrorKind, IntoToolError, ToolError};
///
/// let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// assert_eq!(io.into_tool_error().kind(), ErrorKind::ConnectionFailed);
/// assert_eq!("no route".into_tool_error().kind(), ErrorKind::ExecutionFailed);
/// let own = ToolError::new(ErrorKind::NotFound, "no such row");
/// assert_eq!(own.into_tool_error().kind(), ErrorKind::NotFound);
/// ```
pub trait IntoToolError: 'static {
    /// This error as a [`ToolError`].
    fn into_tool_error(self) -> ToolError;
}

impl ToolError {
    /// What [`IntoToolError`] leaves in place of a `ToolError` it moves out: built in
    /// constant time, and dropped with nothing to free.
    const TAKEN: ToolError = ToolError {
        kind: ErrorKind::Internal,
        attempts: 0,
        message: Cow::Borrowed(""),
        details: None,
    };
}

impl<E> IntoToolError for E
where
    E: Into<crate::BoxError> + 'static,
{
    #[inline]
    fn into_tool_error(mut self) -> ToolError {
        // A `ToolError` (every layer's own error) is passed on unboxed: the type check
        // is resolved when the layer is compiled. It is moved out in exchange for a
        // constant with nothing to drop, not through an `Option`: the compiler kept the
        // check of that `Option`'s tag, and rebuilt the `Result` around the error field
        // by field on every layer's success path as well.
        if let Some(own) = (&mut self as &mut dyn std::any::Any).downcast_mut::<ToolError>() {
            return std::mem::replace(own, ToolError::TAKEN);
        }
        ToolError::from_boxed(self.into())
    }
}

/// How many links of an inner error's chain of sources [`ToolError::from_boxed`] looks
/// down for something it knows; a chain that goes on (or back to itself) is read no
/// further.
pub const MAX_SOURCE_DEPTH: usize = 32;

/// At most this many bytes of an inner error's text become a [`ToolError`]'s message
/// ([`ToolError::from_boxed`], [`ToolError::from_source`]); a longer text is cut at a
/// character boundary and ends with `…`. A client's error that quotes a whole response
/// body, or whose `Display` never ends, gives a message of bounded size.
pub const MAX_SOURCE_MESSAGE: usize = 1024;

/// An error's `Display` text, at most [`MAX_SOURCE_MESSAGE`] bytes (plus `…` when cut).
/// Written through a writer that refuses more, so an endless `Display` stops, and one
/// that fails gives what it wrote before failing rather than a panic.
fn source_text(error: &dyn fmt::Display) -> String {
    struct Bounded {
        text: String,
        cut: bool,
    }
    impl fmt::Write for Bounded {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let room = MAX_SOURCE_MESSAGE - self.text.len();
            if s.len() <= room {
                self.text.push_str(s);
                return Ok(());
            }
            let mut end = room;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            self.text.push_str(&s[..end]);
            self.cut = true;
            Err(fmt::Error)
        }
    }
    let mut out = Bounded {
        text: String::new(),
        cut: false,
    };
    // An error here is ours (the text is full) or the `Display`'s own: either way what
    // was written is kept.
    let _ = fmt::write(&mut out, format_args!("{error}"));
    if out.cut {
        out.text.push('…');
    }
    out.text
}

impl From<crate::BoxError> for ToolError {
    fn from(error: crate::BoxError) -> Self {
        ToolError::from_boxed(error)
    }
}

impl From<tower::timeout::error::Elapsed> for ToolError {
    fn from(e: tower::timeout::error::Elapsed) -> Self {
        ToolError::from_source(ErrorKind::Timeout, e)
    }
}

impl From<tower::load_shed::error::Overloaded> for ToolError {
    fn from(e: tower::load_shed::error::Overloaded) -> Self {
        ToolError::from_source(ErrorKind::Overloaded, e)
    }
}

fn io_kind(kind: std::io::ErrorKind) -> ErrorKind {
    use std::io::ErrorKind as Io;
    match kind {
        Io::TimedOut => ErrorKind::Timeout,
        Io::ConnectionRefused
        | Io::ConnectionReset
        | Io::ConnectionAborted
        | Io::NotConnected
        | Io::BrokenPipe
        | Io::AddrNotAvailable
        | Io::UnexpectedEof => ErrorKind::ConnectionFailed,
        Io::NotFound => ErrorKind::NotFound,
        Io::PermissionDenied => ErrorKind::Unauthorized,
        Io::InvalidInput | Io::InvalidData => ErrorKind::InvalidInput,
        Io::Interrupted => ErrorKind::Cancelled,
        _ => ErrorKind::ExecutionFailed,
    }
}

impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> Self {
        ToolError::from_source(io_kind(e.kind()), e)
    }
}

/// `INVALID_INPUT`, the serde_json error kept as the source. The message says what kind
/// of error it was, where, and what was expected (a missing or unknown field is named:
/// a caller needs it to correct its call), but never a value serde_json quotes
/// (`invalid type: string "4111-...", expected u64` becomes `expected u64`): a payload
/// value must not reach a message that a model or a log reads.
#[cfg(feature = "serde_json")]
impl From<serde_json::Error> for ToolError {
    fn from(e: serde_json::Error) -> Self {
        use serde_json::error::Category;
        let what = match e.classify() {
            Category::Io => "could not be read",
            Category::Syntax => "is not valid JSON",
            Category::Data => "does not have the expected shape",
            Category::Eof => "ends before it is complete",
        };
        let detail = match e.classify() {
            Category::Data => shape_detail(&e),
            _ => None,
        };
        let mut message = format!("json {what}");
        if let Some(detail) = detail {
            message.push_str(": ");
            message.push_str(&detail);
        }
        // serde_json gives line 0 when there was no text (`from_value`).
        if e.line() != 0 {
            message.push_str(&format!(" (line {} column {})", e.line(), e.column()));
        }
        ToolError::new(ErrorKind::InvalidInput, message).with_source(e)
    }
}

/// What a serde_json data error says beside the values it quotes: the field a payload
/// misses or has too many of (the names of the caller's own keys), or what was expected
/// where a value did not fit. `None` when only the values would be left.
#[cfg(feature = "serde_json")]
fn shape_detail(e: &serde_json::Error) -> Option<String> {
    let text = e.to_string();
    // `... at line L column C` when the error has a place: told apart, below.
    let text = match text.rfind(" at line ") {
        Some(at) if e.line() != 0 => &text[..at],
        _ => text.as_str(),
    };
    let detail = if text.starts_with("missing field ")
        || text.starts_with("unknown field ")
        || text.starts_with("duplicate field ")
    {
        // `unknown field `x`, expected one of ...`: the name is the caller's key.
        text
    } else if let Some((_, expected)) = text.rsplit_once(", expected ") {
        // `invalid type: string "4111", expected u64`, `invalid value: ...`,
        // `unknown variant `x`, expected one of ...`: the value goes, the shape stays.
        return Some(cut_detail(&format!("expected {expected}")));
    } else {
        return None;
    };
    Some(cut_detail(detail))
}

/// A detail on one line and at most 200 bytes.
#[cfg(feature = "serde_json")]
fn cut_detail(text: &str) -> String {
    printable(text, 200).into_owned()
}

impl From<tokio::time::error::Elapsed> for ToolError {
    fn from(e: tokio::time::error::Elapsed) -> Self {
        ToolError::from_source(ErrorKind::Timeout, e)
    }
}

impl From<std::convert::Infallible> for ToolError {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_of_a_kind_and_a_static_message_holds_no_details() {
        let mut e = ToolError::timeout("attempt exceeded 30s");
        e.set_attempts(3);
        assert!(
            e.details.is_none(),
            "kind, attempts and message live inline"
        );
        assert_eq!(e.attempts(), 3);
        assert_eq!(e.retry_after(), None);
        assert_eq!(e.elapsed(), None);
        assert!(e.provenance_tool().is_none());
        assert!(StdError::source(&e).is_none());
        // A rate limit without a wait makes no box either.
        assert!(ToolError::rate_limited("slow down", None).details.is_none());
    }

    #[test]
    fn every_detail_reads_back_and_survives_a_clone() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let e = ToolError::from_source(ErrorKind::ConnectionFailed, io)
            .with_retry_after(Duration::from_secs(2))
            .with_elapsed(Duration::from_millis(40))
            .with_attempts(2)
            .with_provenance(Arc::from("weather"), Arc::from("https://api"));
        let copy = e.clone();
        for e in [&e, &copy] {
            assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
            assert_eq!(e.message(), "reset");
            assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
            assert_eq!(e.elapsed(), Some(Duration::from_millis(40)));
            assert_eq!(e.attempts(), 2);
            assert_eq!(e.provenance_tool().map(|t| &**t), Some("weather"));
            assert_eq!(e.provenance_source().map(|s| &**s), Some("https://api"));
            let source = StdError::source(e).expect("the io error is the source");
            assert_eq!(source.to_string(), "reset");
        }
        assert!(format!("{copy:?}").contains("retry_after"));
    }

    #[test]
    fn an_error_made_from_another_type_says_so_and_a_tool_error_never_does() {
        use crate::IntoToolError;
        assert!("db at 10.0.4.7 refused".into_tool_error().is_foreign());
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(io.into_tool_error().is_foreign());
        let own = ToolError::new(ErrorKind::NotFound, "no such row");
        assert!(!own.clone().is_foreign());
        assert!(!own.clone().into_tool_error().is_foreign());
        // Boxed, or down a chain of sources, a `ToolError` is still the tool's own.
        let boxed: crate::BoxError = Box::new(own);
        assert!(!boxed.into_tool_error().is_foreign());
        assert!(
            !ToolError::from_source(ErrorKind::ConnectionFailed, std::io::Error::other("x"))
                .is_foreign()
        );
    }

    #[test]
    fn the_error_is_smaller_than_the_response_it_travels_with() {
        assert!(std::mem::size_of::<ToolError>() <= 40);
    }
}
