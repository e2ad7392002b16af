//! Counters the metrics layer reads: retries (per error code), budget refusals, retries
//! not started because of the deadline or of a too long `retry_after`, exhausted
//! attempts, cancellations in backoff.
//!
//! Only failure paths touch them: a call whose first attempt succeeds counts nothing.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use toolshield_contract::ErrorKind;

const KINDS: usize = ErrorKind::ALL.len();

#[derive(Default)]
struct Counters {
    retries: AtomicU64,
    by_kind: [AtomicU64; KINDS],
    budget_refusals: AtomicU64,
    deadline_refusals: AtomicU64,
    exhausted: AtomicU64,
    cancelled: AtomicU64,
    retry_after_refusals: AtomicU64,
}

/// A handle on a retry layer's counters, shared by every service the layer built and by
/// their clones. Cheap to clone.
#[derive(Clone, Default)]
pub struct RetryStats {
    counters: Arc<Counters>,
}

fn kind_index(kind: ErrorKind) -> Option<usize> {
    ErrorKind::ALL.iter().position(|k| *k == kind)
}

impl RetryStats {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Retries started (attempts after the first).
    pub fn retries(&self) -> u64 {
        self.counters.retries.load(Ordering::Relaxed)
    }

    /// Retries started after a failure of `kind` (the `code` label of
    /// `tool_retries_total`).
    pub fn retries_for(&self, kind: ErrorKind) -> u64 {
        kind_index(kind).map_or(0, |i| self.counters.by_kind[i].load(Ordering::Relaxed))
    }

    /// Retries refused because the retry budget was empty.
    pub fn budget_refusals(&self) -> u64 {
        self.counters.budget_refusals.load(Ordering::Relaxed)
    }

    /// Retries not started because their wait would have ended past the deadline.
    pub fn deadline_refusals(&self) -> u64 {
        self.counters.deadline_refusals.load(Ordering::Relaxed)
    }

    /// Retries not started because the failure asked for a `retry_after` longer than
    /// `max_retry_after`.
    pub fn retry_after_refusals(&self) -> u64 {
        self.counters.retry_after_refusals.load(Ordering::Relaxed)
    }

    /// Calls that failed with a retriable error on their last allowed attempt.
    pub fn exhausted(&self) -> u64 {
        self.counters.exhausted.load(Ordering::Relaxed)
    }

    /// Calls ended with `CANCELLED` while waiting to retry.
    pub fn cancelled(&self) -> u64 {
        self.counters.cancelled.load(Ordering::Relaxed)
    }

    pub(crate) fn record_retry(&self, kind: ErrorKind) {
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
        if let Some(i) = kind_index(kind) {
            self.counters.by_kind[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn record_retry_after_refusal(&self) {
        self.counters
            .retry_after_refusals
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_budget_refusal(&self) {
        self.counters
            .budget_refusals
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_deadline_refusal(&self) {
        self.counters
            .deadline_refusals
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_exhausted(&self) {
        self.counters.exhausted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_cancelled(&self) {
        self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for RetryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryStats")
            .field("retries", &self.retries())
            .field("budget_refusals", &self.budget_refusals())
            .field("deadline_refusals", &self.deadline_refusals())
            .field("retry_after_refusals", &self.retry_after_refusals())
            .field("exhausted", &self.exhausted())
            .field("cancelled", &self.cancelled())
            .finish()
    }
}
