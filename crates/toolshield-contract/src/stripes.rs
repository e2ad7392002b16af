//! Counts kept in cells of the counting thread: [`StripedCount`].
//!
//! A count every call bumps (a layer's hits, a metric's calls) is one atomic that every
//! worker writes: under concurrency each add waits for the line to come from the worker
//! that wrote it last. A striped count gives each thread a cell of its own, on lines of
//! its own, and sums the cells when it is read, which is rare (a render, a snapshot).
//!
//! ```
//! use toolshield_contract::stripes::StripedCount;
//!
//! let hits = StripedCount::default();
//! std::thread::scope(|s| {
//!     for _ in 0..4 {
//!         s.spawn(|| (0..1000).for_each(|_| hits.add(1)));
//!     }
//! });
//! assert_eq!(hits.sum(), 4000);
//! assert_eq!(hits.take(), 4000);
//! assert_eq!(hits.sum(), 0);
//! ```

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The cells of one count: enough that the workers of a runtime on this machine each
/// have their own (the available parallelism, rounded up to a power of two, 4 to 16).
pub fn width() -> usize {
    static WIDTH: OnceLock<usize> = OnceLock::new();
    *WIDTH.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .next_power_of_two()
            .clamp(4, 16)
    })
}

/// The number the next thread to count takes.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The counting thread's cell among `width` (a power of two): a thread takes the next
/// number the first time it counts, so `width` threads that start counting one after
/// another (the workers of a runtime) each have a cell of their own.
#[inline]
pub fn slot(width: usize) -> usize {
    thread_local! {
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    // A cell with nothing to drop is never destroyed, so this always finds it; were it
    // gone, the thread would share cell 0.
    let n = SLOT
        .try_with(|s| {
            let n = s.get();
            if n != usize::MAX {
                return n;
            }
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            s.set(n);
            n
        })
        .unwrap_or(0);
    n & (width.max(1) - 1)
}

/// One thread's count, on lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct CountCell(AtomicU64);

/// A count kept in [`width`] cells, one per counting thread: an add writes only the
/// thread's own line. 128 bytes per cell.
#[derive(Debug)]
pub struct StripedCount {
    cells: Box<[CountCell]>,
}

impl Default for StripedCount {
    fn default() -> Self {
        StripedCount {
            cells: (0..width()).map(|_| CountCell::default()).collect(),
        }
    }
}

impl StripedCount {
    /// Adds `n` in the calling thread's cell.
    #[inline]
    pub fn add(&self, n: u64) {
        self.cells[slot(self.cells.len())]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The count: the sum of the cells (adds made meanwhile may or may not be in it).
    pub fn sum(&self) -> u64 {
        self.cells
            .iter()
            .fold(0u64, |sum, c| sum.wrapping_add(c.0.load(Ordering::Relaxed)))
    }

    /// Takes the count, leaving zero: no add is lost or counted twice between two takes.
    pub fn take(&self) -> u64 {
        self.cells.iter().fold(0u64, |sum, c| {
            sum.wrapping_add(c.0.swap(0, Ordering::Relaxed))
        })
    }

    /// Bytes it takes.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + std::mem::size_of_val(&*self.cells)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_takes_the_next_number_once_and_keeps_its_cell() {
        let width = width();
        assert!(width.is_power_of_two() && (4..=16).contains(&width));
        let before = NEXT.load(Ordering::Relaxed);
        let (first, second) = std::thread::spawn(move || (slot(width), slot(width)))
            .join()
            .unwrap_or((usize::MAX, 0));
        let after = NEXT.load(Ordering::Relaxed);
        assert_eq!(first, second, "a thread keeps its cell");
        assert!(first < width);
        // It took a number of its own (other tests' threads may take some meanwhile).
        assert!(after > before);
        assert!(
            (before..after).any(|n| n & (width - 1) == first),
            "its cell is its number's"
        );
    }

    #[test]
    fn takes_racing_adds_lose_nothing_and_count_nothing_twice() {
        let count = StripedCount::default();
        let taken = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| (0..10_000).for_each(|_| count.add(1)));
            }
            s.spawn(|| {
                for _ in 0..1000 {
                    taken.fetch_add(count.take(), Ordering::Relaxed);
                }
            });
        });
        assert_eq!(taken.load(Ordering::Relaxed) + count.take(), 80_000);
    }

    #[test]
    fn each_cell_has_lines_of_its_own() {
        let count = StripedCount::default();
        assert_eq!(std::mem::align_of::<CountCell>(), 128);
        assert_eq!(count.memory_bytes(), 16 + 128 * width());
    }
}
