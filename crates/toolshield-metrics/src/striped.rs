//! Counters and histograms recorded into cells of the recording thread, summed into the
//! Prometheus recorder's own when the exporter renders or runs its upkeep.
//!
//! A hot tool's counter is one shared atomic in the recorder (with a second one, its
//! generation, written on every increment), and its histogram one shared sample buffer:
//! every call on every worker writes the same lines. Here each thread writes a cell of its
//! own (one of [`width`] per metric, chosen by the thread: see
//! [`toolshield_contract::stripes`]), and
//! [`Stripes::flush`] adds what the cells hold to the recorder's metric before anything
//! reads it. A histogram's samples go to the recorder in batches of [`BATCH`], so no
//! thread's cell holds more than that between renders.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use metrics::{Counter, CounterFn, Histogram, HistogramFn};
use metrics_exporter_prometheus::PrometheusHandle;
use toolshield_contract::stripes::{slot, width, StripedCount};

use crate::prometheus::DRAIN_EVERY;

/// Samples a thread's histogram cell holds before it hands them to the recorder.
pub(crate) const BATCH: usize = 64;

/// A metric whose cells can be added to the recorder's.
trait Flush: Send + Sync {
    fn flush(&self);
}

/// Every striped metric a recorder handed out, to flush before a render or an upkeep.
#[derive(Default)]
pub(crate) struct Stripes {
    members: Mutex<Vec<Weak<dyn Flush>>>,
}

impl Stripes {
    fn members(&self) -> MutexGuard<'_, Vec<Weak<dyn Flush>>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn join(&self, member: Weak<dyn Flush>) {
        let mut members = self.members();
        // Handles dropped since (a layer rebuilt by a reload) leave their entry behind:
        // swept here when the list has doubled, so it stays within twice the live count.
        if members.len() >= 64 && members.len().is_power_of_two() {
            members.retain(|m| m.strong_count() > 0);
        }
        members.push(member);
    }

    /// Adds every cell's count and samples to the recorder's metrics.
    pub(crate) fn flush(&self) {
        // Flushed outside the list's lock: a flush records into the recorder.
        let live: Vec<Arc<dyn Flush>> = self.members().iter().filter_map(Weak::upgrade).collect();
        for member in live {
            member.flush();
        }
    }

    /// A counter recorded into cells, added to `inner` at each flush.
    pub(crate) fn counter(&self, inner: Counter) -> Counter {
        let counter = Arc::new(StripedCounter {
            inner,
            cells: StripedCount::default(),
        });
        let member: Arc<dyn Flush> = counter.clone();
        self.join(Arc::downgrade(&member));
        Counter::from_arc(counter)
    }

    /// A histogram recorded into cells, handed to `inner` by batches and at each flush;
    /// every [`DRAIN_EVERY`] samples it asks `handle` to drain the recorder's buffers.
    pub(crate) fn histogram(&self, inner: Histogram, handle: PrometheusHandle) -> Histogram {
        let histogram = Arc::new(StripedHistogram {
            inner,
            lanes: (0..width()).map(|_| SampleCell::default()).collect(),
            handed: AtomicU64::new(0),
            handle,
        });
        let member: Arc<dyn Flush> = histogram.clone();
        self.join(Arc::downgrade(&member));
        Histogram::from_arc(histogram)
    }
}

struct StripedCounter {
    inner: Counter,
    cells: StripedCount,
}

impl CounterFn for StripedCounter {
    #[inline]
    fn increment(&self, value: u64) {
        self.cells.add(value);
    }

    fn absolute(&self, value: u64) {
        // What the cells held is older than the value set now.
        self.cells.take();
        self.inner.absolute(value);
    }
}

impl Flush for StripedCounter {
    fn flush(&self) {
        let n = self.cells.take();
        if n != 0 {
            self.inner.increment(n);
        }
    }
}

impl Drop for StripedCounter {
    /// A handle dropped before the next render (a layer rebuilt, a service dropped)
    /// leaves its count with the recorder.
    fn drop(&mut self) {
        self.flush();
    }
}

/// One thread's samples, on lines of its own.
#[derive(Default)]
#[repr(align(128))]
struct SampleCell(Mutex<Vec<f64>>);

struct StripedHistogram {
    inner: Histogram,
    lanes: Box<[SampleCell]>,
    /// Samples handed to the recorder, to drain its buffers every [`DRAIN_EVERY`].
    handed: AtomicU64,
    handle: PrometheusHandle,
}

impl StripedHistogram {
    fn lane(&self, index: usize) -> MutexGuard<'_, Vec<f64>> {
        self.lanes[index]
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `samples` to the recorder (the lane's lock is held by the caller, so the
    /// samples of one lane reach it in order), then says how many it has had.
    fn hand_over(&self, samples: &mut Vec<f64>) -> u64 {
        let n = samples.len() as u64;
        for value in samples.drain(..) {
            self.inner.record(value);
        }
        self.handed.fetch_add(n, Ordering::Relaxed) + n
    }
}

impl HistogramFn for StripedHistogram {
    #[inline]
    fn record(&self, value: f64) {
        let mut lane = self.lane(slot(self.lanes.len()));
        if lane.capacity() == 0 {
            lane.reserve_exact(BATCH);
        }
        lane.push(value);
        if lane.len() < BATCH {
            return;
        }
        let before = self.handed.load(Ordering::Relaxed);
        let after = self.hand_over(&mut lane);
        drop(lane);
        // The recorder buffers samples until its upkeep; a process that never runs the
        // upkeep task (a loop that never yields to its runtime) drains it from here.
        if before / DRAIN_EVERY != after / DRAIN_EVERY {
            self.handle.run_upkeep();
        }
    }
}

impl Flush for StripedHistogram {
    fn flush(&self) {
        for index in 0..self.lanes.len() {
            let mut lane = self.lane(index);
            if !lane.is_empty() {
                self.hand_over(&mut lane);
            }
        }
    }
}

impl Drop for StripedHistogram {
    /// A handle dropped before the next render leaves its samples with the recorder.
    fn drop(&mut self) {
        self.flush();
    }
}
