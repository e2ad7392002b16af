//! Per-call overhead of the observability layers on the success path: metrics (outer and
//! per attempt, recording into a Prometheus recorder), tracing spans (no subscriber, and
//! a subscriber that filters them out), and provenance (with and without the output
//! digest), against the bare service in the same group.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use toolshield_benches::{payload_200b, BareTool};
use toolshield_core::ToolRequest;
use toolshield_metrics::{local_prometheus, MetricsConfig, MetricsLayer};
use toolshield_provenance::ProvenanceLayer;
use tower::{Layer, Service};

async fn call_once<S>(svc: &mut S, req: &ToolRequest)
where
    S: Service<ToolRequest>,
    S::Error: std::fmt::Debug,
{
    assert!(toolshield_test::call(svc, req.clone()).await.is_ok());
}

macro_rules! bench {
    ($group:expr, $rt:expr, $req:expr, $name:expr, $svc:expr) => {{
        let svc = $svc;
        $group.bench_function($name, |b| {
            b.to_async(&$rt).iter(|| {
                let mut s = svc.clone();
                let req = &$req;
                async move { call_once(&mut s, req).await }
            })
        });
    }};
}

fn observability(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let req = ToolRequest::new("weather", payload_200b());
    let exporter = local_prometheus();
    let tools = MetricsConfig::with_tools(["weather", "search", "flights"]);
    let metrics = MetricsLayer::build(tools.clone(), exporter.target()).expect("config");
    let no_spans = MetricsLayer::build(
        MetricsConfig {
            spans: false,
            ..tools
        },
        exporter.target(),
    )
    .expect("config");
    // Keep histogram samples from piling up between criterion iterations.
    let upkeep = exporter.clone();

    let mut group = c.benchmark_group("observability_success");
    bench!(group, rt, req, "bare", BareTool);
    bench!(group, rt, req, "metrics", metrics.layer(BareTool));
    bench!(group, rt, req, "metrics_no_spans", no_spans.layer(BareTool));
    bench!(
        group,
        rt,
        req,
        "metrics_outer_and_attempt",
        metrics.layer(metrics.attempt_layer().layer(BareTool))
    );
    bench!(
        group,
        rt,
        req,
        "provenance_no_digest",
        ProvenanceLayer::new().digest(false).layer(BareTool)
    );
    bench!(
        group,
        rt,
        req,
        "provenance",
        ProvenanceLayer::new().layer(BareTool)
    );
    bench!(
        group,
        rt,
        req,
        "metrics_tracing_provenance",
        metrics.layer(ProvenanceLayer::new().layer(metrics.attempt_layer().layer(BareTool)))
    );
    // The same with a subscriber installed that filters the spans out (INFO spans under a
    // WARN subscriber): what a service with logging on pays.
    let subscriber = tracing_subscriber_like::warn_only();
    let _guard = tracing::subscriber::set_default(subscriber);
    bench!(
        group,
        rt,
        req,
        "metrics_tracing_provenance_warn_subscriber",
        metrics.layer(ProvenanceLayer::new().layer(metrics.attempt_layer().layer(BareTool)))
    );
    group.finish();
    upkeep.run_upkeep();
}

/// A subscriber that is only interested in WARN and above.
mod tracing_subscriber_like {
    use tracing::level_filters::LevelFilter;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    pub(crate) struct WarnOnly;

    pub(crate) fn warn_only() -> WarnOnly {
        WarnOnly
    }

    impl Subscriber for WarnOnly {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            *metadata.level() <= tracing::Level::WARN
        }
        fn max_level_hint(&self) -> Option<LevelFilter> {
            Some(LevelFilter::WARN)
        }
        fn new_span(&self, _span: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _span: &Id, _values: &Record<'_>) {}
        fn record_follows_from(&self, _span: &Id, _follows: &Id) {}
        fn event(&self, _event: &Event<'_>) {}
        fn enter(&self, _span: &Id) {}
        fn exit(&self, _span: &Id) {}
    }
}

criterion_group!(benches, observability);
criterion_main!(benches);
