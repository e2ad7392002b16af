//! [`Counter`]: an event counter a layer shares with its services and its handle.

use std::sync::atomic::{AtomicU64, Ordering};

/// An event counter shared by every clone of a layer (hits, replays, store errors), read
/// by its handle and exported by the metrics layer. Relaxed: a count, not a lock.
///
/// ```
/// use toolshield_store::Counter;
///
/// let hits = Counter::default();
/// hits.bump();
/// hits.bump();
/// assert_eq!(hits.get(), 2);
/// ```
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Counts one more.
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
