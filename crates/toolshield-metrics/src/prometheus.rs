//! The Prometheus recorder: install it (or build a local one), render the text
//! exposition, drain histogram samples periodically, and refresh collectors before each
//! render.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SetRecorderError, SharedString,
    Unit,
};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use tokio::task::{AbortHandle, JoinHandle};

use crate::buckets::{is_duration, Durations};
use crate::exposition::recorder_key;
use crate::names::TOOL_DURATION_SECONDS;
use crate::striped::Stripes;
use crate::target::MetricsTarget;

/// The `content-type` of the Prometheus text exposition format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The buckets of `tool_duration_seconds`: 5 ms to 10 minutes, covering the soft (2 s)
/// and hard (30 s) defaults and the worst case of a default call (3 attempts of 30 s
/// plus backoff, about 100 s) with room for longer configured deadlines.
pub const DURATION_BUCKETS: [f64; 17] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
];

/// How often the upkeep task an exporter starts by itself drains histogram samples into
/// their buckets. The recorder buffers every sample until then (about 16 bytes each), so
/// the memory held between two drains is bounded by the call rate times this, and in any
/// case by [`DRAIN_EVERY`] samples per histogram: a recorder an exporter builds drains
/// itself that often, for callers whose runtime never gets to run the task.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// How many samples one histogram takes before a sample drains the recorder itself,
/// whether or not the upkeep task ran: a caller that never yields to its runtime (a
/// `block_on` per call, a loop of calls that complete at once) or records outside any
/// tokio runtime still holds at most about this many buffered samples per histogram
/// (about 1 MiB at 16 bytes each).
pub const DRAIN_EVERY: u64 = 1 << 16;

/// What an exporter's recorder counts in cells of the recording thread, outside the
/// Prometheus recorder.
#[derive(Default)]
struct Cells {
    /// Counters and histograms added to the recorder's before a render or an upkeep.
    stripes: Stripes,
    /// `tool_duration_seconds`, counted into its buckets and rendered by the exporter.
    durations: Durations,
}

/// The recorder an exporter builds: the Prometheus recorder, whose counters and
/// histograms are recorded into cells of the recording thread ([`Stripes`]) that the
/// exporter adds to the recorder's before a render or an upkeep, and whose histogram
/// handles drain it every [`DRAIN_EVERY`] samples; `tool_duration_seconds` is counted
/// into its buckets apart ([`Durations`]) and never reaches the recorder.
struct Draining {
    inner: PrometheusRecorder,
    handle: PrometheusHandle,
    cells: Arc<Cells>,
}

impl Draining {
    fn new(inner: PrometheusRecorder) -> (Self, PrometheusHandle, Arc<Cells>) {
        let handle = inner.handle();
        let cells = Arc::new(Cells::default());
        let recorder = Draining {
            inner,
            handle: handle.clone(),
            cells: Arc::clone(&cells),
        };
        (recorder, handle, cells)
    }
}

impl Recorder for Draining {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if is_duration(key.as_str()) {
            self.cells.durations.describe(description);
        } else {
            self.inner.describe_histogram(key, unit, description);
        }
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.cells
            .stripes
            .counter(self.inner.register_counter(escaped(key).as_ref(), metadata))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(escaped(key).as_ref(), metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if is_duration(key.name()) {
            return Histogram::from_arc(self.cells.durations.series(key));
        }
        self.cells.stripes.histogram(
            self.inner
                .register_histogram(escaped(key).as_ref(), metadata),
            self.handle.clone(),
        )
    }
}

/// `key` as the Prometheus recorder must be given it to render its label values exactly
/// (see [`recorder_key`]): borrowed when it needs no change.
fn escaped(key: &Key) -> Cow<'_, Key> {
    match recorder_key(key) {
        Some(k) => Cow::Owned(k),
        None => Cow::Borrowed(key),
    }
}

/// Something that refreshes gauges or counters just before a render (the breaker
/// states, for instance).
pub trait Collect: Send + Sync {
    /// Brings the metrics it owns up to date.
    fn collect(&self);

    /// Appends families it renders itself to the text exposition, after the recorder's
    /// (for series that must disappear with what they describe: a `metrics` recorder
    /// cannot remove a series). Nothing by default.
    ///
    /// Several collectors may render the same family: the exporter writes it once, with
    /// the first `# HELP` and `# TYPE` given, and a series written by several of them
    /// once, with the sum of their values.
    fn render(&self, out: &mut String) {
        let _ = out;
    }
}

impl<F: Fn() + Send + Sync> Collect for F {
    fn collect(&self) {
        self()
    }
}

/// A Prometheus recorder's render handle, the target to register layers with, and the
/// collectors to refresh before a render. Cheap to clone.
///
/// An exporter drains its recorder's histogram samples by itself: created (or first
/// used) inside a tokio runtime, it starts a task running
/// [`run_upkeep`](Self::run_upkeep) every [`UPKEEP_INTERVAL`], so memory stays bounded
/// whether `/metrics` is scraped or not. The recorders [`install_prometheus`] and
/// [`local_prometheus`] build also drain every [`DRAIN_EVERY`] samples of a histogram,
/// so the bound holds where the task cannot run (no tokio runtime, or a caller that never
/// yields to it); a recorder passed to [`from_parts`](Self::from_parts) relies on the
/// task alone. The task stops once nothing can record into
/// the recorder any more: for a local recorder ([`local_prometheus`]), when the exporter
/// and every layer built with its target are dropped; for the global one, when every
/// clone of the exporter is dropped.
#[derive(Clone)]
pub struct PrometheusExporter {
    handle: PrometheusHandle,
    target: MetricsTarget,
    shared: Arc<Shared>,
}

/// What the clones of one exporter share.
struct Shared {
    collectors: RwLock<Vec<Arc<dyn Collect>>>,
    /// The per-thread cells of the recorder this exporter built, flushed before every
    /// render and upkeep, and the family it renders itself (`None` for a recorder given
    /// to `from_parts`).
    cells: Option<Arc<Cells>>,
    /// The running upkeep task, if any.
    upkeep: Mutex<Option<AbortHandle>>,
}

/// What keeps an upkeep task going: a local recorder still reachable, or for the global
/// recorder, an exporter still alive.
enum Liveness {
    Recorder(Weak<dyn Recorder + Send + Sync>),
    Exporter(Weak<Shared>),
}

impl Liveness {
    fn alive(&self) -> bool {
        match self {
            Liveness::Recorder(w) => w.strong_count() > 0,
            Liveness::Exporter(w) => w.strong_count() > 0,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for PrometheusExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusExporter")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

pub(crate) fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new().set_buckets_for_metric(
        Matcher::Full(TOOL_DURATION_SECONDS.to_owned()),
        &DURATION_BUCKETS,
    )
}

/// Installs a Prometheus recorder as the global `metrics` recorder (no HTTP listener:
/// serve [`PrometheusExporter::render`] from your own endpoint, e.g. `toolshield-axum`'s
/// `/metrics`) and returns its exporter. `tool_duration_seconds` is a histogram with
/// [`DURATION_BUCKETS`].
///
/// Fails if a global recorder is already installed. Histogram samples are drained by
/// the exporter's own upkeep task (see [`PrometheusExporter`]), started here when called
/// inside a tokio runtime, otherwise the first time the exporter is used inside one.
pub fn install_prometheus() -> Result<PrometheusExporter, BuildError> {
    let (recorder, handle, cells) = Draining::new(builder()?.build_recorder());
    metrics::set_global_recorder(recorder)
        .map_err(|e| BuildError::from(SetRecorderError(e.into_inner().inner)))?;
    Ok(PrometheusExporter::with_cells(
        handle,
        MetricsTarget::Global,
        Some(cells),
    ))
}

/// Builds a Prometheus recorder without installing it: layers built with
/// [`target`](PrometheusExporter::target) record into it, and nothing else does. For
/// tests, and for several independent registries in one process.
pub fn local_prometheus() -> PrometheusExporter {
    let recorder = match builder() {
        Ok(b) => b.build_recorder(),
        // The buckets are constant and valid; fall back to summaries rather than panic.
        Err(_) => PrometheusBuilder::new().build_recorder(),
    };
    let (recorder, handle, cells) = Draining::new(recorder);
    PrometheusExporter::with_cells(
        handle,
        MetricsTarget::recorder(Arc::new(recorder)),
        Some(cells),
    )
}

impl PrometheusExporter {
    /// An exporter from a handle you built yourself, and the target its recorder is
    /// reached by. Inside a tokio runtime, starts the upkeep task.
    pub fn from_parts(handle: PrometheusHandle, target: MetricsTarget) -> Self {
        Self::with_cells(handle, target, None)
    }

    fn with_cells(
        handle: PrometheusHandle,
        target: MetricsTarget,
        cells: Option<Arc<Cells>>,
    ) -> Self {
        let exporter = PrometheusExporter {
            handle,
            target,
            shared: Arc::new(Shared {
                collectors: RwLock::new(Vec::new()),
                cells,
                upkeep: Mutex::new(None),
            }),
        };
        exporter.ensure_upkeep();
        exporter
    }

    /// The target to build [`MetricsLayer`](crate::MetricsLayer)s and
    /// `toolshield::collectors::BreakerMetrics` with.
    pub fn target(&self) -> MetricsTarget {
        self.ensure_upkeep();
        self.target.clone()
    }

    /// The underlying handle. Render through [`render`](Self::render): the handle's own
    /// `render` does not see what the recorder's per-thread cells took since the last
    /// render or upkeep, and has no `tool_duration_seconds` (counted into its buckets
    /// outside the recorder, and written by [`render`](Self::render)).
    pub fn handle(&self) -> &PrometheusHandle {
        &self.handle
    }

    /// Refreshes `collector` before every render.
    pub fn add_collector(&self, collector: impl Collect + 'static) {
        self.ensure_upkeep();
        self.shared
            .collectors
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(collector));
    }

    /// Runs the collectors, then renders the text exposition format: the recorder's
    /// families, `tool_duration_seconds`, then those the collectors render themselves
    /// (each family once, see [`Collect::render`]).
    pub fn render(&self) -> String {
        self.ensure_upkeep();
        let collectors = self
            .shared
            .collectors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for c in &collectors {
            c.collect();
        }
        self.flush();
        let mut text = self.handle.render();
        if let Some(cells) = &self.shared.cells {
            cells.durations.render(&mut text);
        }
        // Several collectors may render one family (a breaker collector per registry):
        // merged, so each family is named once and each series written once.
        let mut rendered = String::new();
        for c in &collectors {
            c.render(&mut rendered);
        }
        crate::exposition::merge_families(&rendered, &mut text);
        text
    }

    /// Drains histogram samples into their buckets (and expires idle series when
    /// configured). [`render`](Self::render) and the upkeep task do it too.
    pub fn run_upkeep(&self) {
        self.flush();
        self.handle.run_upkeep();
    }

    /// Adds what the recorder's per-thread cells hold to its metrics.
    fn flush(&self) {
        if let Some(cells) = &self.shared.cells {
            cells.stripes.flush();
        }
    }

    /// Whether an upkeep task of this exporter is running.
    pub fn upkeep_running(&self) -> bool {
        lock(&self.shared.upkeep)
            .as_ref()
            .is_some_and(|task| !task.is_finished())
    }

    /// Replaces the upkeep task by one running [`run_upkeep`](Self::run_upkeep) every
    /// `every` (at least 10 ms) on the current tokio runtime; it stops like the automatic
    /// one (see [`PrometheusExporter`]), or when the returned handle is aborted.
    ///
    /// Needed only for another interval than [`UPKEEP_INTERVAL`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, like [`tokio::spawn`].
    pub fn spawn_upkeep(&self, every: Duration) -> JoinHandle<()> {
        let task = tokio::spawn(self.upkeep_loop(every));
        if let Some(old) = lock(&self.shared.upkeep).replace(task.abort_handle()) {
            old.abort();
        }
        task
    }

    /// Starts the upkeep task if none runs (a runtime that shut down ended it) and a
    /// tokio runtime is current.
    fn ensure_upkeep(&self) {
        let mut upkeep = lock(&self.shared.upkeep);
        if upkeep.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            *upkeep = Some(rt.spawn(self.upkeep_loop(UPKEEP_INTERVAL)).abort_handle());
        }
    }

    /// The upkeep loop: holds the handle (not the exporter) and stops when nothing can
    /// record into the recorder any more.
    fn upkeep_loop(&self, every: Duration) -> impl std::future::Future<Output = ()> + Send {
        let handle = self.handle.clone();
        let cells = self.shared.cells.clone();
        let liveness = match &self.target {
            MetricsTarget::Recorder(r) => Liveness::Recorder(Arc::downgrade(r)),
            MetricsTarget::Global => Liveness::Exporter(Arc::downgrade(&self.shared)),
        };
        let every = every.max(Duration::from_millis(10));
        async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is immediate
            loop {
                tick.tick().await;
                if !liveness.alive() {
                    break;
                }
                if let Some(cells) = &cells {
                    cells.stripes.flush();
                }
                handle.run_upkeep();
            }
        }
    }
}
