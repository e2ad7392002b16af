#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! - [`MetricsLayer`] records, once per logical call, `tool_execution_total{tool,status}`,
//!   `tool_duration_seconds{tool,status}` (histogram), `tool_errors_total{tool,code}`,
//!   `tool_slow_calls_total{tool}`, `tool_cache_hits_total{tool}`,
//!   `tool_cache_misses_total{tool}` and `idempotency_cache_hits_total{tool}` (read from
//!   the response's provenance), and opens one `tool_execution` span (tool, trace_id,
//!   run_id, attempts, outcome, cache_hit, error_code).
//! - Its [`attempt_layer`](MetricsLayer::attempt_layer), placed inside retry, records
//!   `tool_attempts_total{tool,outcome}` and `tool_retries_total{tool,code}` (the code of
//!   the failure that caused the retry) and opens a child `tool_attempt` span per attempt.
//! - `toolshield::collectors::BreakerMetrics` (in the facade) exports `circuit_breaker_state{key,state}`,
//!   `circuit_breaker_transitions_total{key,from,to}` and
//!   `circuit_breaker_rejections_total{key}` from a breaker registry at scrape time.
//! - `install_prometheus` installs a Prometheus recorder and returns a
//!   `PrometheusExporter` to render; `local_prometheus` builds one that is not global
//!   (feature `prometheus`; without it the layers record into the global recorder or the
//!   `MetricsTarget` they are given).
//!
//! `status` and `outcome` take the five values of the `ToolResult` envelope (`success`,
//! `error`, `timeout`, `circuit_open`, `cancelled`), `code` the canonical error codes. The
//! `tool` label is bounded: names outside the registered set are reported as `other`.
//! Handles are registered once per label set and cached, so recording a call allocates no
//! label string. Payloads and outputs never reach a span or a log line.
//!
//! The layers are generic over [`ShieldRequest`](toolshield_contract::ShieldRequest) and
//! [`ShieldResponse`](toolshield_contract::ShieldResponse): they work for HTTP requests too.
//!
//! In [the default stack](https://github.com/toolshield/toolshield/blob/main/docs/layer-order.md) the call layer is outermost and the attempt layer sits
//! inside retry.
//!
//! Spans are plain `tracing` spans: to export them with OpenTelemetry, add a
//! `tracing-opentelemetry` layer to your subscriber; this crate needs no feature for it.

#[cfg(feature = "prometheus")]
mod buckets;
#[cfg(feature = "prometheus")]
mod exposition;
#[cfg(feature = "prometheus")]
pub use exposition::escape_label_value;
mod future;
mod handles;
mod layer;
pub mod names;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "prometheus")]
mod prometheus;
mod service;
#[cfg(feature = "prometheus")]
mod striped;
mod target;

pub use future::{AttemptFuture, ResponseFuture};
pub use layer::{AttemptMetricsLayer, MetricsConfig, MetricsLayer, MAX_TOOLS};
pub use names::Status;
#[cfg(feature = "prometheus")]
pub use prometheus::{
    install_prometheus, local_prometheus, Collect, PrometheusExporter, DRAIN_EVERY,
    DURATION_BUCKETS, PROMETHEUS_CONTENT_TYPE, UPKEEP_INTERVAL,
};
pub use service::{AttemptMetrics, Metrics};
pub use target::MetricsTarget;

/// The `metrics` facade these handles are built on (keys and labels for collectors).
pub use metrics;
/// The `metrics-exporter-prometheus` crate, for its builder and handle types.
#[cfg(feature = "prometheus")]
pub use metrics_exporter_prometheus;
