//! The Prometheus recorder: install it (or build a local one), render the text
//! exposition, run upkeep periodically, and refresh collectors before each render.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::names::TOOL_DURATION_SECONDS;
use crate::target::MetricsTarget;

/// The `content-type` of the Prometheus text exposition format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The buckets of `tool_duration_seconds`: 5 ms to 60 s, covering the soft (2 s) and
/// hard (30 s) defaults.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// Something that refreshes gauges or counters just before a render (the breaker
/// states, for instance).
pub trait Collect: Send + Sync {
    /// Brings the metrics it owns up to date.
    fn collect(&self);

    /// Appends families it renders itself to the text exposition, after the recorder's
    /// (for series that must disappear with what they describe: a `metrics` recorder
    /// cannot remove a series). Nothing by default.
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
#[derive(Clone)]
pub struct PrometheusExporter {
    handle: PrometheusHandle,
    target: MetricsTarget,
    collectors: Arc<RwLock<Vec<Arc<dyn Collect>>>>,
}

impl std::fmt::Debug for PrometheusExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusExporter")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

fn builder() -> Result<PrometheusBuilder, BuildError> {
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
/// Fails if a global recorder is already installed. Call
/// [`spawn_upkeep`](PrometheusExporter::spawn_upkeep) once a tokio runtime runs.
pub fn install_prometheus() -> Result<PrometheusExporter, BuildError> {
    let handle = builder()?.install_recorder()?;
    Ok(PrometheusExporter::from_parts(
        handle,
        MetricsTarget::Global,
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
    let handle = recorder.handle();
    PrometheusExporter::from_parts(handle, MetricsTarget::recorder(Arc::new(recorder)))
}

impl PrometheusExporter {
    /// An exporter from a handle you built yourself, and the target its recorder is
    /// reached by.
    pub fn from_parts(handle: PrometheusHandle, target: MetricsTarget) -> Self {
        PrometheusExporter {
            handle,
            target,
            collectors: Arc::new(RwLock::new(Vec::new())),
        }
    }

    /// The target to build [`MetricsLayer`](crate::MetricsLayer)s and
    /// [`BreakerMetrics`](crate::BreakerMetrics) with.
    pub fn target(&self) -> MetricsTarget {
        self.target.clone()
    }

    /// The underlying handle.
    pub fn handle(&self) -> &PrometheusHandle {
        &self.handle
    }

    /// Refreshes `collector` before every render.
    pub fn add_collector(&self, collector: impl Collect + 'static) {
        self.collectors
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(collector));
    }

    /// Runs the collectors, then renders the text exposition format: the recorder's
    /// families, then those the collectors render themselves.
    pub fn render(&self) -> String {
        let collectors = self
            .collectors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for c in &collectors {
            c.collect();
        }
        let mut text = self.handle.render();
        for c in &collectors {
            c.render(&mut text);
        }
        text
    }

    /// Drains histogram samples into their buckets (and expires idle series when
    /// configured). [`render`](Self::render) does it too; run it periodically so
    /// histograms do not grow between scrapes.
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Spawns a tokio task running [`run_upkeep`](Self::run_upkeep) every `every`.
    /// Abort the returned handle to stop it.
    pub fn spawn_upkeep(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let handle = self.handle.clone();
        let every = every.max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        })
    }
}
