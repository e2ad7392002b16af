//! A call whose future is dropped before it finishes is still counted: `cancelled`, with
//! its duration and the `CANCELLED` code; its attempt too. And the duration histogram
//! has buckets past the default worst case of a call.

mod support;

use std::time::Duration;

use serde_json::json;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::{local_prometheus, MetricsConfig, MetricsLayer, DURATION_BUCKETS};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

/// A tool that answers after the number of seconds in its payload.
fn sleepy(
) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send> + Clone {
    service_fn(|req: ToolRequest| async move {
        let secs = req.payload().as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(secs)).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("done")))
    })
}

#[tokio::test(start_paused = true)]
async fn dropped_call_is_counted_as_cancelled_with_its_duration() {
    let exporter = local_prometheus();
    let metrics =
        MetricsLayer::build(MetricsConfig::with_tools(["weather"]), exporter.target()).unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(metrics.clone())
        .layer(metrics.attempt_layer())
        .service(sleepy());

    // The caller gives up after 3 s on a call that would take 60 s.
    let call = svc
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("weather", json!(60)));
    assert!(tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .is_err());
    // A call that finishes is counted once, as before.
    let done = svc
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("weather", json!(1)));
    done.await.unwrap();

    let text = exporter.render();
    let exp = support::parse(&text).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{text}"));
    fn weather(status: &str) -> [(&str, &str); 2] {
        [("tool", "weather"), ("status", status)]
    }
    assert_eq!(
        exp.series("tool_execution_total"),
        [
            (support::labels_of(&weather("cancelled")), 1.0),
            (support::labels_of(&weather("success")), 1.0),
        ]
        .into_iter()
        .collect(),
        "{text}"
    );
    assert_eq!(
        exp.value("tool_duration_seconds_count", &weather("cancelled")),
        Some(1.0)
    );
    assert_eq!(
        exp.value("tool_duration_seconds_sum", &weather("cancelled")),
        Some(3.0)
    );
    assert_eq!(
        exp.value(
            "tool_errors_total",
            &[("tool", "weather"), ("code", "CANCELLED")]
        ),
        Some(1.0)
    );
    assert_eq!(
        exp.series("tool_attempts_total"),
        [
            (
                support::labels_of(&[("tool", "weather"), ("outcome", "cancelled")]),
                1.0
            ),
            (
                support::labels_of(&[("tool", "weather"), ("outcome", "success")]),
                1.0
            ),
        ]
        .into_iter()
        .collect(),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn duration_buckets_reach_ten_minutes() {
    assert_eq!(DURATION_BUCKETS.last(), Some(&600.0));
    let exporter = local_prometheus();
    let metrics =
        MetricsLayer::build(MetricsConfig::with_tools(["weather"]), exporter.target()).unwrap();
    let mut svc = ServiceBuilder::new().layer(metrics).service(sleepy());
    // The default worst case (3 attempts of 30 s plus backoff), and a long one.
    for secs in [100, 400] {
        svc.ready()
            .await
            .unwrap()
            .call(ToolRequest::new("weather", json!(secs)))
            .await
            .unwrap();
    }

    let text = exporter.render();
    let exp = support::parse(&text).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{text}"));
    let bucket = |le: &str| {
        exp.value(
            "tool_duration_seconds_bucket",
            &[("tool", "weather"), ("status", "success"), ("le", le)],
        )
    };
    assert_eq!(
        [
            bucket("60"),
            bucket("120"),
            bucket("300"),
            bucket("600"),
            bucket("+Inf")
        ],
        [Some(0.0), Some(1.0), Some(1.0), Some(2.0), Some(2.0)],
        "{text}"
    );
}
