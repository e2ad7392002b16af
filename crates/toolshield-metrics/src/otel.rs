//! OpenTelemetry export of the toolshield spans (feature `otel`, off by default).
//!
//! The metrics layer opens one `tool_execution` span per call and one `tool_attempt` span
//! per attempt, with structured fields only (never payload values). Adding the layer this
//! module builds to a `tracing-subscriber` registry sends those spans to any OpenTelemetry
//! tracer (OTLP, Jaeger, an in-memory exporter in tests):
//!
//! ```ignore
//! use tracing_subscriber::prelude::*;
//! let tracer = provider.tracer("toolshield");
//! tracing_subscriber::registry().with(toolshield_metrics::otel::layer(tracer)).init();
//! ```

use opentelemetry::trace::Tracer;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

/// A `tracing-subscriber` layer exporting the toolshield spans through `tracer`.
pub fn layer<S, T>(tracer: T) -> OpenTelemetryLayer<S, T>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    T: Tracer + 'static,
    T::Span: Send + Sync,
{
    tracing_opentelemetry::layer().with_tracer(tracer)
}
