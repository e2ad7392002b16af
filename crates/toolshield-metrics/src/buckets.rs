//! `tool_duration_seconds` counted into its buckets by the recording thread, and rendered
//! by the exporter itself.
//!
//! The Prometheus recorder keeps every histogram sample (16 bytes each) in a shared buffer
//! until its upkeep sorts them into buckets: each call pays a push into that buffer (three
//! atomic read-modify-writes and an epoch pin), and the upkeep pays for each sample again.
//! The one histogram every call records is counted here instead: each thread adds the
//! sample to the bucket it falls in, in a cell of its own (one of [`width`] per series,
//! chosen by the thread: see [`toolshield_contract::stripes`]), under that cell's
//! uncontended lock. Nothing is buffered, so the memory of the family is fixed per series,
//! and a render adds up the cells. The text is the one the recorder would write for the
//! same samples (the exposition test checks it line for line).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use metrics::{HistogramFn, Key, SharedString};
use metrics_exporter_prometheus::formatting::{
    sanitize_description, sanitize_label_key, sanitize_metric_name,
};
use toolshield_contract::stripes::{slot, width};

use crate::exposition::escape_label_value;
use crate::names::TOOL_DURATION_SECONDS;
use crate::prometheus::DURATION_BUCKETS;

/// One slot per bound, and one for samples above the last (or NaN): `+Inf` only.
const SLOTS: usize = DURATION_BUCKETS.len() + 1;

/// Whether a metric of this name is `tool_duration_seconds` as the recorder would render
/// it (its names are sanitized).
pub(crate) fn is_duration(name: &str) -> bool {
    name == TOOL_DURATION_SECONDS || sanitize_metric_name(name) == TOOL_DURATION_SECONDS
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every series of `tool_duration_seconds` one recorder handed out, in the order they
/// were first registered, with the family's description.
#[derive(Default)]
pub(crate) struct Durations {
    series: Mutex<Registered>,
    help: Mutex<Option<SharedString>>,
}

/// The series in the order they were registered, and where each key's is.
#[derive(Default)]
struct Registered {
    order: Vec<Arc<Series>>,
    index: HashMap<Key, usize>,
}

impl Durations {
    /// The series of `key`: registered once, so a layer rebuilt by a reload goes on
    /// counting into the series its predecessor counted into.
    pub(crate) fn series(&self, key: &Key) -> Arc<Series> {
        let mut registered = lock(&self.series);
        let Registered { order, index } = &mut *registered;
        if let Some(s) = index.get(key).and_then(|&i| order.get(i)) {
            return Arc::clone(s);
        }
        let s = Arc::new(Series {
            key: key.clone(),
            lanes: (0..width()).map(|_| Lane::default()).collect(),
        });
        index.insert(key.clone(), order.len());
        order.push(Arc::clone(&s));
        s
    }

    /// Sets the `# HELP` text.
    pub(crate) fn describe(&self, description: SharedString) {
        *lock(&self.help) = Some(description);
    }

    /// Appends the family (nothing while no series is registered), in the text format
    /// the recorder writes its own histograms in.
    pub(crate) fn render(&self, out: &mut String) {
        let series: Vec<Arc<Series>> = lock(&self.series).order.clone();
        if series.is_empty() {
            return;
        }
        let name = TOOL_DURATION_SECONDS;
        if let Some(help) = lock(&self.help).as_ref() {
            let _ = writeln!(out, "# HELP {name} {}", sanitize_description(help));
        }
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut labels = String::new();
        for s in &series {
            labels.clear();
            for label in s.key.labels() {
                let _ = write!(labels, "{}=\"", sanitize_label_key(label.key()));
                escape_label_value(&mut labels, label.value());
                labels.push_str("\",");
            }
            let counts = s.counts();
            let mut cumulative = 0u64;
            for (bound, n) in DURATION_BUCKETS.iter().zip(counts.slots) {
                cumulative = cumulative.wrapping_add(n);
                let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
            }
            let count = cumulative.wrapping_add(counts.slots[SLOTS - 1]);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {count}");
            let plain = labels.strip_suffix(',').unwrap_or(&labels);
            let braced = |out: &mut String, suffix: &str| {
                out.push_str(name);
                out.push_str(suffix);
                if !plain.is_empty() {
                    out.push('{');
                    out.push_str(plain);
                    out.push('}');
                }
            };
            braced(out, "_sum");
            let _ = writeln!(out, " {}", counts.sum);
            braced(out, "_count");
            let _ = writeln!(out, " {count}");
        }
        out.push('\n');
    }
}

/// What one cell has counted: samples per slot (not cumulative) and their sum.
#[derive(Clone, Copy, Default)]
struct Counts {
    slots: [u64; SLOTS],
    sum: f64,
}

impl Counts {
    #[inline]
    fn add(&mut self, value: f64, n: u64) {
        let slot = DURATION_BUCKETS
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(SLOTS - 1);
        if let Some(c) = self.slots.get_mut(slot) {
            *c = c.wrapping_add(n);
        }
        self.sum += if n == 1 { value } else { value * n as f64 };
    }
}

/// One thread's counts, on lines of its own.
#[derive(Default)]
#[repr(align(128))]
struct Lane(Mutex<Counts>);

/// One series of `tool_duration_seconds` (one label set).
pub(crate) struct Series {
    key: Key,
    lanes: Box<[Lane]>,
}

impl Series {
    /// The sum of every cell's counts.
    fn counts(&self) -> Counts {
        self.lanes
            .iter()
            .fold(Counts::default(), |mut total, lane| {
                let lane = lock(&lane.0);
                for (t, n) in total.slots.iter_mut().zip(lane.slots) {
                    *t = t.wrapping_add(n);
                }
                total.sum += lane.sum;
                total
            })
    }

    #[inline]
    fn lane(&self) -> Option<&Lane> {
        self.lanes.get(slot(self.lanes.len()))
    }
}

impl HistogramFn for Series {
    #[inline]
    fn record(&self, value: f64) {
        if let Some(lane) = self.lane() {
            lock(&lane.0).add(value, 1);
        }
    }

    fn record_many(&self, value: f64, count: usize) {
        if let Some(lane) = self.lane() {
            lock(&lane.0).add(value, count as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_counts_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        let mut c = Counts::default();
        for v in [0.0, 0.005, 0.0051, 600.0, 600.5, f64::NAN, -1.0] {
            c.add(v, 1);
        }
        assert_eq!(c.slots[0], 3, "0, 0.005 (on the bound) and -1");
        assert_eq!(c.slots[1], 1, "0.0051");
        assert_eq!(c.slots[SLOTS - 2], 1, "600 (the last bound)");
        assert_eq!(c.slots[SLOTS - 1], 2, "600.5 and NaN: +Inf only");
        assert_eq!(c.slots.iter().sum::<u64>(), 7);
    }

    #[test]
    fn a_key_registered_twice_is_one_series() {
        let d = Durations::default();
        let key = Key::from_name(TOOL_DURATION_SECONDS);
        let a = d.series(&key);
        let b = d.series(&key);
        assert!(Arc::ptr_eq(&a, &b));
        a.record(0.5);
        b.record_many(0.5, 3);
        assert_eq!(a.counts().slots.iter().sum::<u64>(), 4);
        assert_eq!(a.counts().sum, 2.0);
    }

    #[test]
    fn series_are_rendered_in_the_order_they_were_registered_and_found_again() {
        use metrics::Label;
        let d = Durations::default();
        let key = |i: usize| {
            Key::from_parts(
                TOOL_DURATION_SECONDS,
                vec![Label::new("tool", format!("t{i}"))],
            )
        };
        let first: Vec<_> = (0..300).map(|i| d.series(&key(i))).collect();
        for (i, s) in first.iter().enumerate().rev() {
            assert!(Arc::ptr_eq(s, &d.series(&key(i))));
        }
        first[7].record(1.0);
        let mut out = String::new();
        d.render(&mut out);
        let counts: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("tool_duration_seconds_count"))
            .collect();
        assert_eq!(counts.len(), 300);
        assert_eq!(counts[0], "tool_duration_seconds_count{tool=\"t0\"} 0");
        assert_eq!(counts[7], "tool_duration_seconds_count{tool=\"t7\"} 1");
        assert_eq!(counts[299], "tool_duration_seconds_count{tool=\"t299\"} 0");
    }

    #[test]
    fn nothing_is_rendered_before_a_series_is_registered() {
        let d = Durations::default();
        d.describe("described".into());
        let mut out = String::new();
        d.render(&mut out);
        assert!(out.is_empty(), "{out}");
    }

    /// The lines of the `tool_duration_seconds` family in `text`, sorted.
    fn family(text: &str) -> Vec<&str> {
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.strip_prefix("# HELP ")
                    .or_else(|| l.strip_prefix("# TYPE "))
                    .unwrap_or(l)
                    .starts_with(TOOL_DURATION_SECONDS)
            })
            .collect();
        lines.sort_unstable();
        lines
    }

    #[test]
    fn the_family_is_rendered_as_the_recorder_renders_the_same_samples() {
        use metrics::{Label, Recorder};

        let recorder = crate::prometheus::builder()
            .map(|b| b.build_recorder())
            .unwrap_or_else(|_| {
                metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder()
            });
        let help = "Duration of \\ tool calls,\nin \"seconds\".";
        recorder.describe_histogram(TOOL_DURATION_SECONDS.into(), None, help.into());
        let ours = Durations::default();
        ours.describe(help.into());

        let keys = [
            Key::from_parts(
                TOOL_DURATION_SECONDS,
                vec![
                    Label::new("tool", "weather"),
                    Label::new("status", "success"),
                ],
            ),
            // A name chosen by an attacker: quotes, backslashes, a line feed.
            Key::from_parts(
                TOOL_DURATION_SECONDS,
                vec![
                    Label::new("tool", "we\"ird\\to\nol\\"),
                    Label::new("status", "error"),
                ],
            ),
            Key::from_name(TOOL_DURATION_SECONDS),
        ];
        let samples = [
            0.0, 0.001, 0.005, 0.0051, 0.3, 1.0, 2.5, 30.0, 599.9, 600.0, 601.0, 1e-9,
        ];
        let meta = metrics::Metadata::new("test", metrics::Level::INFO, None);
        for (i, key) in keys.iter().enumerate() {
            let theirs = recorder.register_histogram(key, &meta);
            let mine = ours.series(key);
            for v in samples.iter().skip(i) {
                theirs.record(*v);
                mine.record(*v);
            }
        }
        let theirs = recorder.handle().render();
        let mut mine = String::new();
        ours.render(&mut mine);
        assert_eq!(
            family(&mine),
            family(&theirs),
            "ours:\n{mine}\ntheirs:\n{theirs}"
        );
        assert_eq!(family(&mine).len(), 2 + 3 * (DURATION_BUCKETS.len() + 3));
        assert!(mine.ends_with("\n\n"), "a family ends with an empty line");
    }

    #[test]
    fn counts_of_racing_threads_are_all_rendered() {
        let d = Durations::default();
        let series = d.series(&Key::from_name(TOOL_DURATION_SECONDS));
        std::thread::scope(|s| {
            for t in 0..8 {
                let series = &series;
                s.spawn(move || {
                    for i in 0..10_000 {
                        series.record(if (i + t) % 2 == 0 { 0.25 } else { 0.75 });
                    }
                });
            }
        });
        let c = series.counts();
        assert_eq!(c.slots[5], 40_000, "0.25 is on the bound 0.25");
        assert_eq!(c.slots[7], 40_000, "0.75 is in the bucket up to 1");
        assert_eq!(c.slots.iter().sum::<u64>(), 80_000);
        // Dyadic samples: the sum is exact whatever order the cells added them in.
        assert_eq!(c.sum, 40_000.0);
    }

    #[test]
    fn a_cell_holds_a_fixed_size_whatever_it_counts() {
        assert!(std::mem::size_of::<Lane>() <= 256);
    }
}
