//! [`MetricsTarget`]: which recorder the handles are registered with.

use std::fmt;
use std::sync::Arc;

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Level, Metadata, Recorder, SharedString, Unit,
};

static META: Metadata<'static> = Metadata::new("toolshield", Level::INFO, Some(module_path!()));

/// Where metric handles are registered: the global recorder (or a thread-local one set
/// with [`metrics::with_local_recorder`] at registration time), or a given recorder.
///
/// Handles are registered once per label set, the first time they are needed, and cached:
/// recording a call allocates no label string.
#[derive(Clone, Default)]
pub enum MetricsTarget {
    /// Whatever recorder is installed when a handle is first needed.
    #[default]
    Global,
    /// This recorder (e.g. a `PrometheusRecorder` that was built, not installed: tests,
    /// or several registries in one process).
    Recorder(Arc<dyn Recorder + Send + Sync>),
}

impl fmt::Debug for MetricsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsTarget::Global => f.write_str("MetricsTarget::Global"),
            MetricsTarget::Recorder(_) => f.write_str("MetricsTarget::Recorder(..)"),
        }
    }
}

impl MetricsTarget {
    /// A target registering with `recorder`.
    pub fn recorder<R: Recorder + Send + Sync + 'static>(recorder: Arc<R>) -> Self {
        MetricsTarget::Recorder(recorder)
    }

    fn with<T>(&self, f: impl FnOnce(&dyn Recorder) -> T) -> T {
        match self {
            MetricsTarget::Global => metrics::with_recorder(f),
            MetricsTarget::Recorder(r) => f(r.as_ref()),
        }
    }

    /// Registers (or finds) a counter.
    pub fn counter(&self, key: &Key) -> Counter {
        self.with(|r| r.register_counter(key, &META))
    }

    /// Registers (or finds) a gauge.
    pub fn gauge(&self, key: &Key) -> Gauge {
        self.with(|r| r.register_gauge(key, &META))
    }

    /// Registers (or finds) a histogram.
    pub fn histogram(&self, key: &Key) -> Histogram {
        self.with(|r| r.register_histogram(key, &META))
    }

    /// Describes a counter (its unit and help text) to the recorder, for collectors of
    /// other crates.
    pub fn describe_counter(&self, name: &'static str, unit: Option<Unit>, help: &'static str) {
        self.with(|r| {
            r.describe_counter(
                KeyName::from_const_str(name),
                unit,
                SharedString::const_str(help),
            )
        });
    }

    pub(crate) fn describe_histogram(
        &self,
        name: &'static str,
        unit: Option<Unit>,
        help: &'static str,
    ) {
        self.with(|r| {
            r.describe_histogram(
                KeyName::from_const_str(name),
                unit,
                SharedString::const_str(help),
            )
        });
    }
}
