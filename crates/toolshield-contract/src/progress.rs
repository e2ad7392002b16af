//! [`Progress`]: the progress handle a tool finds on its request.
//!
//! A long tool (or an adapter relaying a remote server's progress notifications) calls
//! [`Progress::report`] through `req.call_state()`. Each report
//!
//! - resets the idle limit of the running attempt, when the attempt timeout has one
//!   (the [`IdleClock`] the timeout layer puts on the attempt's copy of the request);
//! - reaches the caller's callback, if the caller gave one ([`Progress::on_progress`]),
//!   with the attempt it came from: reports from every attempt reach it;
//! - is counted, with its message kept, for the call's provenance
//!   ([`Progress::reports`], [`Progress::last_message`]).
//!
//! Cheap when unused: an unobserved handle is two empty pointers and reporting on it does
//! nothing; nothing is allocated for a call unless its progress is observed (a callback,
//! the provenance layer) or an idle limit is configured.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use toolshield_contract::CallState;
//!
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let log = Arc::clone(&seen);
//! let state = CallState::new().on_progress(move |event| {
//!     log.lock().unwrap().push((event.progress, event.message.map(str::to_owned)));
//! });
//!
//! // what the tool does, on its copy of the request
//! state.progress().report(3.0, 10.0, Some("3 of 10 pages"));
//! state.progress().heartbeat();
//!
//! assert_eq!(state.progress().reports(), 2);
//! assert_eq!(state.progress().last_message().as_deref(), Some("3 of 10 pages"));
//! assert_eq!(seen.lock().unwrap()[0], (Some(3.0), Some("3 of 10 pages".to_owned())));
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::time;
use tokio::time::Instant;

/// The longest message kept for provenance, in bytes; a longer one is cut at a character
/// boundary and ends with `…`, and control characters and line separators become spaces
/// (the callback still sees it whole). A remote server chooses the message: it must not
/// grow what a response carries, nor break out of its line where a model reads it.
pub const MAX_PROGRESS_MESSAGE: usize = 256;

/// One progress report, as the caller's callback sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ProgressEvent<'a> {
    /// The attempt that reported (1 for the first).
    pub attempt: u32,
    /// How many reports the call has made, this one included.
    pub seq: u64,
    /// How far the work is, in the tool's unit (MCP's `progress`), if it said.
    pub progress: Option<f64>,
    /// The total in the same unit (MCP's `total`), if known.
    pub total: Option<f64>,
    /// A human-readable message, if any.
    pub message: Option<&'a str>,
}

type Callback = dyn Fn(&ProgressEvent<'_>) + Send + Sync;

/// What every copy of one call's request shares: the count, the last message, and the
/// caller's callback.
struct Sink {
    reports: AtomicU64,
    last_message: Mutex<Option<Arc<str>>>,
    callback: Option<Arc<Callback>>,
}

/// The activity clock of one attempt, for an idle limit: when the attempt started, when
/// it last reported progress, and whether it is over.
///
/// The attempt timeout creates one per attempt and puts it on the attempt's copy of the
/// request ([`Progress::set_idle_clock`]); a report on that copy moves it forward. A
/// report made on another attempt's copy moves that attempt's clock, never this one, so
/// a straggler of a previous attempt cannot keep the next one alive. Once the attempt is
/// over ([`close`](Self::close)), its reports are ignored altogether.
#[derive(Debug)]
pub struct IdleClock {
    origin: Instant,
    // Nanoseconds from `origin` to the last report; 0 until the first one.
    last: AtomicU64,
    closed: AtomicBool,
}

impl IdleClock {
    /// A clock for an attempt starting at `origin`.
    #[must_use]
    pub fn new(origin: Instant) -> Self {
        IdleClock {
            origin,
            last: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// When the attempt last showed activity: its last report, or its start.
    pub fn last_activity(&self) -> Instant {
        let nanos = self.last.load(Ordering::Acquire);
        self.origin
            .checked_add(Duration::from_nanos(nanos))
            .unwrap_or(self.origin)
    }

    /// Records activity now. Returns `false`, recording nothing, once the clock is closed.
    pub fn touch(&self) -> bool {
        if self.is_closed() {
            return false;
        }
        let since = time::now().saturating_duration_since(self.origin);
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(nanos, Ordering::AcqRel);
        true
    }

    /// Ends the attempt: later reports made on its copy of the request are ignored.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether the attempt is over.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// The progress handle of a call, part of its [`CallState`](crate::CallState).
///
/// A tool reports with [`report`](Self::report) or [`heartbeat`](Self::heartbeat); the
/// caller observes with [`on_progress`](Self::on_progress) (or
/// [`CallState::on_progress`](crate::CallState::on_progress) when building the request).
/// Clones share the caller's callback and the count (a clone of a template request sent
/// as a call of its own gets a count of its own: [`CallState::own`](crate::CallState::own));
/// the idle clock belongs to one attempt.
#[derive(Clone, Default)]
pub struct Progress {
    sink: Option<Arc<Sink>>,
    clock: Option<Arc<IdleClock>>,
    attempt: u32,
}

impl Progress {
    /// An unobserved handle: reports on it go nowhere.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports progress: how far the work is (`progress`, in the tool's unit), the total if
    /// known, and a message. Each may be absent: `report(None, None, None)` is a plain
    /// heartbeat. Resets the attempt's idle limit, reaches the caller's callback (called
    /// here, on the reporting task: it should be quick and must not panic) and is counted
    /// for provenance. Does nothing once the attempt is over (it timed out, was dropped or
    /// finished, when an idle limit is configured) or when nobody observes the call.
    ///
    /// The arguments take the shape of an MCP progress notification, so an adapter relays
    /// one as `progress.report(p.progress, p.total, p.message.as_deref())`.
    pub fn report(
        &self,
        progress: impl Into<Option<f64>>,
        total: impl Into<Option<f64>>,
        message: Option<&str>,
    ) {
        if let Some(clock) = &self.clock {
            if !clock.touch() {
                return;
            }
        }
        let Some(sink) = &self.sink else {
            return;
        };
        let seq = sink
            .reports
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if let Some(message) = message {
            // Kept for the response's provenance, which a model reads: on one line.
            let kept: Arc<str> = Arc::from(crate::printable(message, MAX_PROGRESS_MESSAGE));
            *sink
                .last_message
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(kept);
        }
        if let Some(callback) = &sink.callback {
            callback(&ProgressEvent {
                attempt: self.attempt.max(1),
                seq,
                progress: progress.into(),
                total: total.into(),
                message,
            });
        }
    }

    /// A report with no value and no message: "still working".
    pub fn heartbeat(&self) {
        self.report(None, None, None);
    }

    /// Calls `callback` with every report of the call, from every attempt. Replaces an
    /// earlier callback and starts a fresh count.
    #[must_use]
    pub fn on_progress<F>(mut self, callback: F) -> Self
    where
        F: Fn(&ProgressEvent<'_>) + Send + Sync + 'static,
    {
        self.sink = Some(Arc::new(Sink::new(Some(Arc::new(callback)))));
        self
    }

    /// Starts counting reports (for provenance) if nothing observes the call yet; keeps the
    /// caller's callback and count otherwise. The provenance layer calls it.
    pub fn observe(&mut self) {
        if self.sink.is_none() {
            self.sink = Some(Arc::new(Sink::new(None)));
        }
    }

    /// Whether anything observes the call's reports (a callback, or a count for provenance).
    pub fn is_observed(&self) -> bool {
        self.sink.is_some()
    }

    /// How many reports the call has made, across its attempts (0 when unobserved).
    pub fn reports(&self) -> u64 {
        self.sink
            .as_ref()
            .map_or(0, |s| s.reports.load(Ordering::Acquire))
    }

    /// The last message reported, cut to [`MAX_PROGRESS_MESSAGE`] bytes.
    pub fn last_message(&self) -> Option<Arc<str>> {
        let sink = self.sink.as_ref()?;
        sink.last_message
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts the attempt's idle clock on this copy of the request (the attempt timeout does,
    /// when it has an idle limit).
    pub fn set_idle_clock(&mut self, clock: Arc<IdleClock>) {
        self.clock = Some(clock);
    }

    /// The attempt's idle clock, if the attempt timeout put one.
    pub fn idle_clock(&self) -> Option<&Arc<IdleClock>> {
        self.clock.as_ref()
    }

    /// A fresh count and last message for this copy, with the same callback: for a
    /// request that becomes a call of its own while other copies of it are around
    /// ([`CallState::own`](crate::CallState::own)). Nothing to do when nothing observes
    /// the call.
    pub(crate) fn detach(&mut self) {
        if let Some(sink) = &self.sink {
            let callback = sink.callback.clone();
            self.sink = Some(Arc::new(Sink::new(callback)));
        }
    }

    /// A new attempt: its reports carry `attempt`, and the previous attempt's idle clock
    /// is left behind (called by [`CallState::begin_attempt`](crate::CallState::begin_attempt)).
    pub(crate) fn begin_attempt(&mut self, attempt: u32) {
        self.attempt = attempt;
        self.clock = None;
    }
}

impl Sink {
    fn new(callback: Option<Arc<Callback>>) -> Self {
        Sink {
            reports: AtomicU64::new(0),
            last_message: Mutex::new(None),
            callback,
        }
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress")
            .field("observed", &self.sink.is_some())
            .field(
                "callback",
                &self.sink.as_ref().is_some_and(|s| s.callback.is_some()),
            )
            .field("reports", &self.reports())
            .field("idle_clock", &self.clock.is_some())
            .finish()
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_message_is_on_one_line_and_cut_at_a_character_boundary() {
        let p = Progress::new().on_progress(|_| {});
        // A tool (or the MCP server behind it) chooses the text; the model reads it.
        let hostile = format!("step 1\n\u{1b}[2J{}", "é".repeat(200));
        p.report(None::<f64>, None::<f64>, Some(&hostile));
        let kept = p.last_message().expect("kept");
        assert!(kept.len() <= MAX_PROGRESS_MESSAGE, "{}", kept.len());
        assert!(!kept.chars().any(char::is_control), "{kept:?}");
        assert!(kept.starts_with("step 1  [2J"), "{kept:?}");
        assert!(kept.ends_with('…'));
        p.report(None::<f64>, None::<f64>, Some("short"));
        assert_eq!(p.last_message().as_deref(), Some("short"));
    }

    #[test]
    fn an_unobserved_handle_counts_nothing() {
        let p = Progress::new();
        p.report(1.0, None, Some("x"));
        assert_eq!(p.reports(), 0);
        assert_eq!(p.last_message(), None);
        assert!(!p.is_observed());
    }

    #[test]
    fn a_closed_clock_swallows_reports() {
        let mut p = Progress::new();
        p.observe();
        let clock = Arc::new(IdleClock::new(time::now()));
        p.set_idle_clock(Arc::clone(&clock));
        p.heartbeat();
        clock.close();
        p.report(None, None, Some("late"));
        assert_eq!(p.reports(), 1);
        assert_eq!(p.last_message(), None);
    }

    #[test]
    fn clones_share_the_count_and_a_new_attempt_drops_the_clock() {
        let mut p = Progress::new();
        p.observe();
        p.set_idle_clock(Arc::new(IdleClock::new(time::now())));
        let mut next = p.clone();
        next.begin_attempt(2);
        assert!(next.idle_clock().is_none());
        next.heartbeat();
        p.heartbeat();
        assert_eq!(p.reports(), 2);
    }
}
