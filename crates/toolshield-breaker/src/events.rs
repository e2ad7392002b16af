//! Transition events: the states, the reasons, and where events go (tracing, subscribers,
//! callbacks, a JSON-lines file); the counts read for metrics.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use tokio::sync::broadcast;
use toolshield_contract::time::Rfc3339;

use crate::event_log::{EventLog, NotQueued};

/// The state of a breaker as reported by status, events and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum CircuitState {
    /// Calls pass and are recorded.
    Closed,
    /// Calls are rejected with `CIRCUIT_OPEN` until the wait is over.
    Open,
    /// A limited number of probes pass; their outcome closes or re-opens the breaker.
    HalfOpen,
    /// Manual: every call is rejected until the override is lifted.
    ForcedOpen,
    /// Manual: every call passes and is recorded, the breaker never trips.
    Disabled,
    /// Manual shadow mode: the breaker records and reports transitions, but never rejects.
    MetricsOnly,
}

impl CircuitState {
    /// Every state, in declaration order.
    pub const ALL: [CircuitState; 6] = [
        CircuitState::Closed,
        CircuitState::Open,
        CircuitState::HalfOpen,
        CircuitState::ForcedOpen,
        CircuitState::Disabled,
        CircuitState::MetricsOnly,
    ];

    /// The stable lowercase name, as used in metric labels and JSON (`half_open`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
            CircuitState::ForcedOpen => "forced_open",
            CircuitState::Disabled => "disabled",
            CircuitState::MetricsOnly => "metrics_only",
        }
    }
}

impl fmt::Display for CircuitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transition happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum TransitionReason {
    /// `consecutive_failures` failures in a row.
    ConsecutiveFailures,
    /// The failure rate of the window reached `failure_rate`.
    FailureRate,
    /// The slow-call rate of the window reached `slow_call_rate`.
    SlowCallRate,
    /// The open wait is over: the breaker admits probes.
    WaitElapsed,
    /// `half_open_successes` probes succeeded.
    ProbesSucceeded,
    /// A probe failed.
    ProbeFailed,
    /// A probe succeeded but was slow while slow-call tripping is on.
    ProbeSlow,
    /// Manual: forced open.
    ForcedOpen,
    /// Manual: forced closed (disabled).
    ForcedClosed,
    /// Manual: metrics-only (shadow) mode.
    MetricsOnly,
    /// Manual: reset to a fresh closed breaker.
    Reset,
}

impl TransitionReason {
    /// The stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            TransitionReason::ConsecutiveFailures => "consecutive_failures",
            TransitionReason::FailureRate => "failure_rate",
            TransitionReason::SlowCallRate => "slow_call_rate",
            TransitionReason::WaitElapsed => "wait_elapsed",
            TransitionReason::ProbesSucceeded => "probes_succeeded",
            TransitionReason::ProbeFailed => "probe_failed",
            TransitionReason::ProbeSlow => "probe_slow",
            TransitionReason::ForcedOpen => "forced_open",
            TransitionReason::ForcedClosed => "forced_closed",
            TransitionReason::MetricsOnly => "metrics_only",
            TransitionReason::Reset => "reset",
        }
    }

    /// Whether an operator caused it.
    pub const fn is_manual(self) -> bool {
        matches!(
            self,
            TransitionReason::ForcedOpen
                | TransitionReason::ForcedClosed
                | TransitionReason::MetricsOnly
                | TransitionReason::Reset
        )
    }
}

impl fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One transition or override of one breaker. Serialised as one line of the JSON-lines
/// log: `{"at":"...","key":"weather","from":"closed","to":"open","reason":"consecutive_failures","shadow":false}`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BreakerEvent {
    /// When it happened (wall clock; RFC 3339 in JSON).
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "toolshield_contract::time::serialize")
    )]
    pub at: SystemTime,
    /// The breaker key (the tool name by default).
    pub key: Arc<str>,
    /// The state before.
    pub from: CircuitState,
    /// The state after.
    pub to: CircuitState,
    /// Why.
    pub reason: TransitionReason,
    /// A transition of the shadow state machine of a metrics-only breaker: reported, but
    /// no call was rejected because of it.
    pub shadow: bool,
}

/// A callback receiving every event.
pub(crate) type Callback = Arc<dyn Fn(&BreakerEvent) + Send + Sync>;

/// Where events go.
pub(crate) struct EventHub {
    tx: broadcast::Sender<BreakerEvent>,
    callbacks: RwLock<Vec<Callback>>,
    log: Mutex<Option<EventLog>>,
    /// Events the file sink dropped because its writer was behind.
    log_dropped: AtomicU64,
}

impl EventHub {
    pub(crate) fn new(log: Option<EventLog>) -> Self {
        let (tx, _) = broadcast::channel(1024);
        EventHub {
            tx,
            callbacks: RwLock::new(Vec::new()),
            log: Mutex::new(log),
            log_dropped: AtomicU64::new(0),
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<BreakerEvent> {
        self.tx.subscribe()
    }

    pub(crate) fn add_callback(&self, cb: Callback) {
        self.callbacks
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(cb);
    }

    /// Sends every event from now on to `log` (the previous writer finishes its queue).
    pub(crate) fn set_log(&self, log: EventLog) {
        *self.log.lock().unwrap_or_else(|e| e.into_inner()) = Some(log);
    }

    /// Blocks until the file sink has written every event emitted so far.
    pub(crate) fn flush_log(&self) {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(log) = log {
            log.flush();
        }
    }

    /// Events the file sink dropped because its writer was behind or gone.
    pub(crate) fn log_dropped(&self) -> u64 {
        self.log_dropped.load(Ordering::Relaxed)
    }

    /// Delivers one event everywhere. Called with the breaker's transition lock held, so
    /// the events of one key arrive in the order the transitions happened.
    ///
    /// The key is a `Debug` field in the `tracing` events: a key taken from a request (a
    /// host, a tool name a model chose) is shown quoted, its control characters and line
    /// separators escaped, so it cannot end the log line and forge another.
    pub(crate) fn emit(&self, event: BreakerEvent) {
        if event.reason.is_manual() {
            tracing::warn!(
                target: "toolshield::breaker",
                key = ?event.key,
                from = event.from.as_str(),
                to = event.to.as_str(),
                reason = event.reason.as_str(),
                shadow = event.shadow,
                "circuit breaker override"
            );
        } else {
            tracing::info!(
                target: "toolshield::breaker",
                key = ?event.key,
                from = event.from.as_str(),
                to = event.to.as_str(),
                reason = event.reason.as_str(),
                shadow = event.shadow,
                "circuit breaker transition"
            );
        }
        // Queued, never written here: this runs under the transition lock.
        let queued = match &*self.log.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(log) => log.try_send(event.json_line()),
            None => Ok(()),
        };
        if let Err(why) = queued {
            let dropped = self.log_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            let why = match why {
                NotQueued::Full => "the writer is behind",
                NotQueued::Closed => "the writer stopped",
            };
            tracing::warn!(
                target: "toolshield::breaker",
                key = ?event.key,
                dropped,
                "breaker event not written to the event log: {why}"
            );
        }
        let callbacks = self.callbacks.read().unwrap_or_else(|e| e.into_inner());
        for cb in callbacks.iter() {
            cb(&event);
        }
        drop(callbacks);
        // No receiver is not an error.
        let _ = self.tx.send(event);
    }
}

impl BreakerEvent {
    /// The event as one line of the JSON-lines log, newline included.
    pub fn json_line(&self) -> String {
        let mut key = String::with_capacity(self.key.len() + 2);
        json_escape(&self.key, &mut key);
        format!(
            "{{\"at\":\"{}\",\"key\":\"{key}\",\"from\":\"{}\",\"to\":\"{}\",\"reason\":\"{}\",\"shadow\":{}}}\n",
            Rfc3339(self.at),
            self.from.as_str(),
            self.to.as_str(),
            self.reason.as_str(),
            self.shadow
        )
    }
}

/// Appends `text` to `out` as the inside of a JSON string.
///
/// Besides what JSON requires (`"`, `\\`, U+0000 to U+001F), every other control
/// character (DEL, the C1 controls, NEL among them) and the Unicode line and paragraph
/// separators are escaped: a key taken from a request cannot break the line for a reader
/// that ends lines on them (Python's `str.splitlines`, many log viewers).
fn json_escape(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
}

/// How many times one breaker went from one state to another
/// (`circuit_breaker_transitions_total{key,from,to}`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TransitionCount {
    /// The breaker key.
    pub key: Arc<str>,
    /// The state before.
    pub from: CircuitState,
    /// The state after.
    pub to: CircuitState,
    /// How many times.
    pub count: u64,
}

/// What the breakers a registry no longer holds had counted, summed over their keys:
/// breakers evicted by a sweep, and the breakers that were not kept because the registry
/// was full ([`overflowed`](crate::BreakerRegistry::overflowed) calls). An evicted breaker
/// takes its per-key counts with it; these totals keep a sum over keys true (a metrics
/// exporter adds them to the series of keys it does not name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct EvictedCounts {
    /// Calls they rejected.
    pub rejections: u64,
    /// Their transitions and overrides as `(from, to, count)`, in the order of
    /// [`CircuitState::ALL`]; pairs never seen are left out.
    pub transitions: Vec<(CircuitState, CircuitState, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> BreakerEvent {
        BreakerEvent {
            at: SystemTime::UNIX_EPOCH,
            key: Arc::from("t"),
            from: CircuitState::Closed,
            to: CircuitState::Open,
            reason: TransitionReason::ConsecutiveFailures,
            shadow: false,
        }
    }

    #[test]
    fn events_past_a_full_log_are_dropped_and_counted_but_still_delivered() {
        let (log, rx) = EventLog::detached();
        let hub = EventHub::new(Some(log));
        let seen = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&seen);
        hub.add_callback(Arc::new(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        for _ in 0..crate::event_log::QUEUE + 3 {
            hub.emit(event());
        }
        assert_eq!(hub.log_dropped(), 3);
        assert_eq!(
            seen.load(Ordering::Relaxed),
            crate::event_log::QUEUE as u64 + 3,
            "the callback sees every event"
        );
        drop(rx);
    }
}
