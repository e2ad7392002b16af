//! [`Counter`]: an event counter a layer shares with its services and its handle.

use toolshield_contract::stripes::StripedCount;

/// An event counter shared by every clone of a layer (hits, replays, store errors), read
/// by its handle and exported by the metrics layer. Each thread counts in a cell of its
/// own ([`StripedCount`]): workers bumping one layer's counter on every call do not
/// write the same line; a read sums the cells.
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
pub struct Counter(StripedCount);

impl Counter {
    /// Counts one more.
    #[inline]
    pub fn bump(&self) {
        self.0.add(1);
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        self.0.sum()
    }
}
