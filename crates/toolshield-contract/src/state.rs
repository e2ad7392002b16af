//! [`CallState`]: the per-call state the generic layers share, carried by the request.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{CallKind, CallTokens, ErrorKind, Progress, ProgressEvent, Resume};

/// What the generic layers know about one logical call, carried by the request (a field
/// of `ToolRequest`, an entry in the extensions of `http::Request`): the cancellation
/// tokens, the deadline, the attempt number, why the previous attempt failed, a
/// side-effect class that overrides what the request type implies, the call's
/// [`Progress`] handle, and the [`Resume`] handle a claiming layer installs.
///
/// The layers read it through [`ShieldRequest::call_state`](crate::ShieldRequest::call_state)
/// and write it through [`ShieldRequest::call_state_mut`](crate::ShieldRequest::call_state_mut).
/// A request type with no room for it simply has none: deadlines, cancellation tokens and
/// attempt numbers are then absent for that type (a timeout still times out, a retry
/// still retries).
///
/// Cheap to clone: the tokens sit behind one `Arc`.
///
/// ```
/// use toolshield_contract::{CallKind, CallState};
///
/// let mut state = CallState::new().with_kind(CallKind::ReadOnly);
/// assert_eq!(state.attempt(), 1);
/// let first = state.tokens().attempt().clone();
/// state.begin_attempt(2);
/// assert!(!first.is_cancelled(), "starting an attempt cancels nothing");
/// assert!(state.tokens().attempt().clone().is_cancelled() == false);
/// assert_eq!(state.attempt(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct CallState {
    tokens: CallTokens,
    // Both in 8 bytes each (`Stamp`): the request, moved through every layer, stays small.
    entered: Stamp,
    deadline: Stamp,
    attempt: u32,
    retry_reason: Option<ErrorKind>,
    kind: Option<CallKind>,
    probe: bool,
    // Whether a layer made the shared parts (tokens, progress record) this call's own
    // ([`own`](Self::own)); clones made inside the call copy `true`.
    owned: bool,
    progress: Progress,
    // Installed by the idempotency layer for a call it claimed; `None` otherwise (no
    // allocation on the common path).
    resume: Option<Resume>,
}

impl Default for CallState {
    fn default() -> Self {
        Self::new()
    }
}

impl CallState {
    /// Fresh state: new tokens, no deadline, attempt 1, no kind override.
    #[must_use]
    pub fn new() -> Self {
        Self::with_tokens(CallTokens::new())
    }

    /// Fresh state around existing tokens.
    #[must_use]
    pub fn with_tokens(tokens: CallTokens) -> Self {
        CallState {
            tokens,
            entered: Stamp::NONE,
            deadline: Stamp::NONE,
            attempt: 1,
            retry_reason: None,
            kind: None,
            probe: false,
            owned: false,
            progress: Progress::new(),
            resume: None,
        }
    }

    /// Uses the caller's cancellation token for the call (the attempts get children of it).
    #[must_use]
    pub fn with_call_token(mut self, token: CancellationToken) -> Self {
        self.tokens = CallTokens::with_call(token);
        self
    }

    /// Sets the side-effect class, overriding what the request type implies.
    #[must_use]
    pub fn with_kind(mut self, kind: CallKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Sets a deadline for the whole call.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Stamp::of(deadline);
        self
    }

    /// Calls `callback` with every progress report of the call, from every attempt
    /// ([`Progress::on_progress`]).
    #[must_use]
    pub fn on_progress<F>(mut self, callback: F) -> Self
    where
        F: Fn(&ProgressEvent<'_>) + Send + Sync + 'static,
    {
        self.progress = self.progress.on_progress(callback);
        self
    }

    /// The progress handle: a tool reports on it
    /// (`req.call_state().map(|s| s.progress().report(..))`).
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// The progress handle, mutably (the layers install what observes it).
    pub fn progress_mut(&mut self) -> &mut Progress {
        &mut self.progress
    }

    /// The call and attempt tokens.
    pub fn tokens(&self) -> &CallTokens {
        &self.tokens
    }

    /// Replaces the tokens (a request builder taking the caller's token).
    pub fn set_tokens(&mut self, tokens: CallTokens) {
        self.tokens = tokens;
    }

    /// When the call entered the shield, if a layer stamped it ([`enter`](Self::enter)).
    pub fn entered(&self) -> Option<Instant> {
        self.entered.get()
    }

    /// The call's entry stamp: the first layer to see the call stamps it with one clock
    /// read ([`time::now`](crate::time::now)); every later layer (and every clone of the
    /// request: retries, hedges, single-flight followers) gets the same instant back, so
    /// the layers measure the call from one reading instead of each reading the clock.
    ///
    /// Entering also makes the state the call's own ([`own`](Self::own)).
    pub fn enter(&mut self) -> Instant {
        self.own();
        match self.entered.get() {
            Some(at) => at,
            None => {
                let at = crate::time::now();
                self.entered = Stamp::of(at);
                at
            }
        }
    }

    /// Sets the entry stamp to a reading the caller already holds (a layer that read the
    /// clock for its own purpose), unless one is set.
    pub fn enter_at(&mut self, at: Instant) -> Instant {
        self.own();
        match self.entered.get() {
            Some(earlier) => earlier,
            None => {
                self.entered = Stamp::of(at);
                at
            }
        }
    }

    /// Makes the parts a request shares with its clones this call's own, once per call:
    /// the first layer to see the call does it (entering does; so do the retry, the
    /// hedge, the fallback and the cancel layer before they keep a copy of the request or
    /// its tokens, and the attempt timeout before it guards the attempt token). A request that another request still shares
    /// its tokens with (a clone of a template, sent as a call of its own) gets a fresh
    /// attempt token (a child of the same call token, which stays the caller's) and a
    /// fresh progress count (the callback stays the caller's): one call's timeout never
    /// cancels the token another call's tool watches, and one call's provenance never
    /// shows another's reports. A request built for its call keeps what it has, with no
    /// allocation, and so does a `Progress` handle its caller kept to watch it; copies
    /// made inside the call after this keep sharing.
    #[inline]
    pub fn own(&mut self) {
        if !self.owned {
            self.owned = true;
            if self.tokens.is_shared() {
                self.detach();
            }
        }
    }

    /// Whether a layer made this state the call's own ([`own`](Self::own)): `false` for
    /// a request no layer has seen yet (a template, or a clone of one).
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// [`own`](Self::own) for a request other requests share tokens with: out of line,
    /// as few calls are such clones.
    #[cold]
    #[inline(never)]
    fn detach(&mut self) {
        self.tokens = self.tokens.next_attempt();
        self.progress.detach();
    }

    /// The deadline of the whole call, if one is set.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.get()
    }

    /// Sets the deadline, keeping an earlier one already set: a layer can shorten the
    /// call's budget, never lengthen it.
    pub fn set_deadline(&mut self, deadline: Instant) {
        match self.deadline.get() {
            Some(earlier) if earlier < deadline => {}
            _ => self.deadline = Stamp::of(deadline),
        }
    }

    /// Replaces the deadline (or clears it), whatever was set before.
    pub fn replace_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline.map_or(Stamp::NONE, Stamp::of);
    }

    /// The attempt number, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.attempt.max(1)
    }

    /// Starts attempt `attempt`: from the second attempt on, a fresh attempt token (a
    /// child of the same call token: the previous one may have been cancelled by a
    /// timeout), and progress reports numbered with the new attempt, without the previous
    /// attempt's idle clock. Starting the attempt the state is already at changes nothing.
    pub fn begin_attempt(&mut self, attempt: u32) {
        if attempt > 1 && attempt != self.attempt {
            self.tokens = self.tokens.next_attempt();
        }
        if attempt != self.attempt {
            self.progress.begin_attempt(attempt);
        }
        self.attempt = attempt;
        self.probe = false;
    }

    /// Gives the call a fresh attempt token (a new child of the same call token),
    /// keeping the attempt number: for another try at the call outside the retry's
    /// numbering (a fallback tier), which must not inherit a token a timeout of the
    /// previous try may have cancelled.
    pub fn renew_attempt_token(&mut self) {
        self.tokens = self.tokens.next_attempt();
    }

    /// Why the previous attempt failed; `None` on a first attempt.
    pub fn retry_reason(&self) -> Option<ErrorKind> {
        self.retry_reason
    }

    /// Records why the previous attempt failed (the retry layer sets it on the copy it
    /// sends as the next attempt).
    pub fn set_retry_reason(&mut self, kind: Option<ErrorKind>) {
        self.retry_reason = kind;
    }

    /// The side-effect class set on the state, if any.
    pub fn kind(&self) -> Option<CallKind> {
        self.kind
    }

    /// Sets (or clears) the side-effect class.
    pub fn set_kind(&mut self, kind: Option<CallKind>) {
        self.kind = kind;
    }

    /// Whether a circuit breaker admitted this attempt as a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Marks the attempt as a half-open probe (the breaker does, on the request it passes
    /// on); a fresh attempt ([`begin_attempt`](Self::begin_attempt)) clears the mark.
    pub fn set_probe(&mut self, probe: bool) {
        self.probe = probe;
    }

    /// The resume handle, when a layer that holds a durable claim for the call installed
    /// one (the idempotency layer does, for a call it claimed): the service records there
    /// where its work can be resumed, and learns where to resume from after a takeover.
    pub fn resume(&self) -> Option<&Resume> {
        self.resume.as_ref()
    }

    /// Installs (or removes) the resume handle.
    pub fn set_resume(&mut self, resume: Option<Resume>) {
        self.resume = resume;
    }

    /// Tells the call's claim, if a layer holds one, that an attempt is being handed to
    /// the service that does the work ([`Resume::mark_started`]); nothing otherwise.
    #[inline]
    pub fn mark_started(&self) {
        if let Some(resume) = &self.resume {
            resume.mark_started();
        }
    }

    /// Tells the call's claim, if a layer holds one, that a retry is about to send the
    /// call's first attempt ([`Resume::retry_begins`]); nothing otherwise.
    #[inline]
    pub fn retry_begins(&self) {
        if let Some(resume) = &self.resume {
            resume.retry_begins();
        }
    }

    /// Tells the call's claim, if a layer holds one, that the retry's last attempt was
    /// refused and took no effect ([`Resume::attempt_refused`]); nothing otherwise.
    pub fn attempt_refused(&self) {
        if let Some(resume) = &self.resume {
            resume.attempt_refused();
        }
    }
}

/// [`CallState::own`] on the state `req` carries, for a layer that guards an attempt
/// token without entering the call. A request whose state does not exist yet (an
/// `http::Request` keeps it in its extensions, created on first write) has no tokens to
/// share and is given no state here, which would allocate.
#[inline]
pub fn own_call<R: crate::ShieldRequest + ?Sized>(req: &mut R) {
    if req.call_state().is_some() {
        if let Some(state) = req.call_state_mut() {
            state.own();
        }
    }
}

/// An optional instant in 8 bytes: signed nanoseconds from a process-wide origin (the
/// first instant ever stored), `i64::MIN` when absent. Instants more than 292 years from
/// the origin saturate.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp(i64);

static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

impl Stamp {
    const NONE: Stamp = Stamp(i64::MIN);

    fn of(at: Instant) -> Stamp {
        let origin = *ORIGIN.get_or_init(|| at);
        let nanos = |d: std::time::Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        Stamp(if at >= origin {
            nanos(at - origin)
        } else {
            // Never `i64::MIN`, which means absent.
            -nanos(origin - at)
        })
    }

    fn get(self) -> Option<Instant> {
        if self == Stamp::NONE {
            return None;
        }
        let origin = *ORIGIN.get()?;
        let d = std::time::Duration::from_nanos(self.0.unsigned_abs());
        Some(if self.0 >= 0 {
            origin.checked_add(d).unwrap_or(origin)
        } else {
            origin.checked_sub(d).unwrap_or(origin)
        })
    }
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

#[cfg(test)]
mod stamp_tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_stamp_gives_back_the_instant_it_was_made_of() {
        let now = Instant::now();
        for at in [
            now,
            now + Duration::from_nanos(1),
            now + Duration::from_secs(366 * 86_400),
            now.checked_sub(Duration::from_millis(1500)).unwrap_or(now),
        ] {
            assert_eq!(Stamp::of(at).get(), Some(at));
        }
        assert_eq!(Stamp::NONE.get(), None);
    }

    #[test]
    fn the_deadline_and_entry_round_trip_through_the_state() {
        let now = Instant::now();
        let mut state = CallState::new();
        assert_eq!(state.deadline(), None);
        assert_eq!(state.entered(), None);
        state.set_deadline(now + Duration::from_secs(5));
        state.set_deadline(now + Duration::from_secs(9));
        assert_eq!(state.deadline(), Some(now + Duration::from_secs(5)));
        state.replace_deadline(None);
        assert_eq!(state.deadline(), None);
        assert_eq!(state.enter_at(now), now);
        assert_eq!(state.enter(), now, "the first stamp stays");
        assert_eq!(state.entered(), Some(now));
    }
}
