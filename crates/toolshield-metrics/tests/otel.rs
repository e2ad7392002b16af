//! OpenTelemetry export of the toolshield spans (run with `--features otel-test`).
#![cfg(feature = "otel-test")]

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use serde_json::json;
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::{local_prometheus, MetricsConfig, MetricsLayer};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tracing_subscriber::layer::SubscriberExt;

const SECRET: &str = "sk-live-51HZsecretTOKEN";

#[tokio::test]
async fn tool_spans_reach_an_opentelemetry_exporter_without_payload_values() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(toolshield_metrics::otel::layer(
        provider.tracer("toolshield"),
    ));
    let _guard = tracing::subscriber::set_default(subscriber);

    let prom = local_prometheus();
    let metrics =
        MetricsLayer::build(MetricsConfig::with_tools(["weather"]), prom.target()).unwrap();
    let svc = ServiceBuilder::new()
        .layer(metrics.clone())
        .layer(metrics.attempt_layer())
        .service(service_fn(|_req: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!({"token": SECRET})))
        }));
    let req = ToolRequest::new("weather", json!({"api_key": SECRET}))
        .kind(CallKind::ReadOnly)
        .trace_id("trace-42");
    svc.oneshot(req).await.unwrap();
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert!(names.contains(&"tool_execution"), "{names:?}");
    assert!(names.contains(&"tool_attempt"), "{names:?}");
    let call = spans.iter().find(|s| s.name == "tool_execution").unwrap();
    let attrs: Vec<String> = call
        .attributes
        .iter()
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect();
    assert!(attrs.iter().any(|a| a == "tool=weather"), "{attrs:?}");
    let everything = format!("{spans:?}");
    assert!(
        !everything.contains(SECRET),
        "a payload or output value reached the exporter"
    );
}
