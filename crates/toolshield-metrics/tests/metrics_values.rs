//! Exact metric values and label sets after a known sequence of calls through a real
//! stack (successes, a cache hit, retries, timeouts, a breaker opening, a slow call, a
//! replay, an unregistered tool), checked on the rendered Prometheus exposition.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield::collectors::BreakerMetrics;
use toolshield_breaker::{BreakerConfig, BreakerLayer};
use toolshield_cache::{CacheConfig, CacheLayer};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::{local_prometheus, MetricsConfig, MetricsLayer};
use toolshield_provenance::ProvenanceLayer;
use toolshield_retry::{BackoffStrategy, RetryLayer};
use toolshield_timeout::TimeoutLayer;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

use support::{labels_of, parse, Labels};

fn expect(pairs: &[(&[(&str, &str)], f64)]) -> BTreeMap<Labels, f64> {
    pairs.iter().map(|(l, v)| (labels_of(l), *v)).collect()
}

#[tokio::test(start_paused = true)]
async fn known_sequence_gives_exact_values() {
    let exporter = local_prometheus();
    let metrics = MetricsLayer::build(
        MetricsConfig::with_tools(["weather", "flaky", "slow", "pay"]),
        exporter.target(),
    )
    .unwrap();
    let breaker = BreakerLayer::from_config(&BreakerConfig {
        consecutive_failures: 3,
        open_wait: Duration::from_secs(30),
        ..BreakerConfig::default()
    })
    .unwrap();
    exporter.add_collector(BreakerMetrics::new(
        breaker.registry().clone(),
        exporter.target(),
    ));

    let flaky_calls = Arc::new(AtomicU32::new(0));
    let flaky = Arc::clone(&flaky_calls);
    let tool = service_fn(move |req: ToolRequest| {
        let flaky = Arc::clone(&flaky);
        async move {
            match req.tool() {
                "flaky" if flaky.fetch_add(1, Ordering::SeqCst) == 0 => Err(ToolError::new(
                    ErrorKind::UpstreamUnavailable,
                    "503 from upstream",
                )),
                "slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok(ToolResponse::new(json!("late")))
                }
                "sluggish" => {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    Ok(ToolResponse::new(json!("slow but fine")))
                }
                "pay" => {
                    let mut res = ToolResponse::new(json!({"paid": true}));
                    res.provenance.replayed = true;
                    Ok(res)
                }
                _ => Ok(ToolResponse::new(json!({"temp": 21}))),
            }
        }
    });
    let mut svc = ServiceBuilder::new()
        .layer(metrics.clone())
        .layer(ProvenanceLayer::new())
        .layer(CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(600))).unwrap())
        .layer(
            RetryLayer::default()
                .with_backoff(BackoffStrategy::none())
                .without_budget(),
        )
        .layer(metrics.attempt_layer())
        .layer(breaker)
        .layer(TimeoutLayer::new(Duration::from_secs(1)).soft_threshold(Duration::from_millis(500)))
        .service(tool);

    async fn run<S>(svc: &mut S, tool: &str, kind: CallKind) -> Result<ToolResponse, ToolError>
    where
        S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
    {
        let req = ToolRequest::new(tool.to_owned(), json!({"q": 1})).kind(kind);
        svc.ready().await?.call(req).await
    }

    // 1. miss, 2. hit.
    let first = run(&mut svc, "weather", CallKind::ReadOnly).await.unwrap();
    let second = run(&mut svc, "weather", CallKind::ReadOnly).await.unwrap();
    assert!(!first.provenance.cache_hit && second.provenance.cache_hit);
    // 3. one retry after UPSTREAM_UNAVAILABLE.
    let flaky = run(&mut svc, "flaky", CallKind::Idempotent).await.unwrap();
    assert_eq!(flaky.provenance.attempts, 2);
    // 4. three attempt timeouts: the third opens the breaker of `slow`.
    let err = run(&mut svc, "slow", CallKind::Idempotent)
        .await
        .unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (ErrorKind::Timeout, 3));
    // 5. rejected by the open breaker, not retried.
    let err = run(&mut svc, "slow", CallKind::Idempotent)
        .await
        .unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (ErrorKind::CircuitOpen, 1));
    // 6. a slow success of an unregistered tool.
    let slow = run(&mut svc, "sluggish", CallKind::Idempotent)
        .await
        .unwrap();
    assert!(slow.provenance.slow);
    // 7. a replay.
    run(&mut svc, "pay", CallKind::Mutating).await.unwrap();

    let text = exporter.render();
    let exp = parse(&text).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{text}"));

    assert_eq!(exp.types["tool_execution_total"], "counter");
    assert_eq!(exp.types["tool_duration_seconds"], "histogram");
    assert_eq!(exp.types["circuit_breaker_state"], "gauge");

    assert_eq!(
        exp.series("tool_execution_total"),
        expect(&[
            (&[("tool", "weather"), ("status", "success")], 2.0),
            (&[("tool", "flaky"), ("status", "success")], 1.0),
            (&[("tool", "slow"), ("status", "timeout")], 1.0),
            (&[("tool", "slow"), ("status", "circuit_open")], 1.0),
            (&[("tool", "other"), ("status", "success")], 1.0),
            (&[("tool", "pay"), ("status", "success")], 1.0),
        ])
    );
    assert_eq!(
        exp.series("tool_attempts_total"),
        expect(&[
            (&[("tool", "weather"), ("outcome", "success")], 1.0),
            (&[("tool", "flaky"), ("outcome", "error")], 1.0),
            (&[("tool", "flaky"), ("outcome", "success")], 1.0),
            (&[("tool", "slow"), ("outcome", "timeout")], 3.0),
            (&[("tool", "slow"), ("outcome", "circuit_open")], 1.0),
            (&[("tool", "other"), ("outcome", "success")], 1.0),
            (&[("tool", "pay"), ("outcome", "success")], 1.0),
        ])
    );
    assert_eq!(
        exp.series("tool_errors_total"),
        expect(&[
            (&[("tool", "slow"), ("code", "TIMEOUT")], 1.0),
            (&[("tool", "slow"), ("code", "CIRCUIT_OPEN")], 1.0),
        ])
    );
    assert_eq!(
        exp.series("tool_retries_total"),
        expect(&[
            (&[("tool", "flaky"), ("code", "UPSTREAM_UNAVAILABLE")], 1.0),
            (&[("tool", "slow"), ("code", "TIMEOUT")], 2.0),
        ])
    );
    assert_eq!(
        exp.series("tool_cache_hits_total"),
        expect(&[(&[("tool", "weather")], 1.0)])
    );
    assert_eq!(
        exp.series("tool_cache_misses_total"),
        expect(&[(&[("tool", "weather")], 1.0)])
    );
    assert_eq!(
        exp.series("idempotency_cache_hits_total"),
        expect(&[(&[("tool", "pay")], 1.0)])
    );
    assert_eq!(
        exp.series("tool_slow_calls_total"),
        expect(&[(&[("tool", "other")], 1.0)])
    );

    // Histogram: counts per status, and the exact duration of the timed-out call (3 x 1 s).
    let counts = exp.series("tool_duration_seconds_count");
    assert_eq!(counts.len(), 6);
    assert_eq!(
        counts[&labels_of(&[("tool", "weather"), ("status", "success")])],
        2.0
    );
    let slow = &[("tool", "slow"), ("status", "timeout")];
    assert_eq!(exp.value("tool_duration_seconds_sum", slow), Some(3.0));
    let bucket = |le: &str| {
        exp.value(
            "tool_duration_seconds_bucket",
            &[("tool", "slow"), ("status", "timeout"), ("le", le)],
        )
    };
    assert_eq!(
        (bucket("2"), bucket("4"), bucket("+Inf")),
        (Some(0.0), Some(1.0), Some(1.0))
    );
    let sluggish = &[("tool", "other"), ("status", "success")];
    assert_eq!(exp.value("tool_duration_seconds_sum", sluggish), Some(0.7));

    // Breaker metrics: `slow` is open, the others closed.
    let state = |key: &str, state: &str| {
        exp.value("circuit_breaker_state", &[("key", key), ("state", state)])
    };
    assert_eq!(state("slow", "open"), Some(1.0));
    assert_eq!(state("slow", "closed"), Some(0.0));
    assert_eq!(state("slow", "half_open"), Some(0.0));
    assert_eq!(state("flaky", "closed"), Some(1.0));
    assert_eq!(state("flaky", "open"), Some(0.0));
    assert_eq!(exp.series("circuit_breaker_state").len(), 5 * 6, "{text}");
    assert_eq!(
        exp.series("circuit_breaker_transitions_total"),
        expect(&[(&[("key", "slow"), ("from", "closed"), ("to", "open")], 1.0)])
    );
    assert_eq!(
        exp.value("circuit_breaker_rejections_total", &[("key", "slow")]),
        Some(1.0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_tool_name_needing_escapes_cannot_forge_a_duration_series() {
    // A registered name with a quote, a label separator and a backslash: rendered as one
    // label value, never as a second label or another series.
    let hostile = "a\",status=\"error\\";
    let exporter = local_prometheus();
    let mut svc = MetricsLayer::build(
        MetricsConfig::with_tools([hostile, "plain"]),
        exporter.target(),
    )
    .unwrap()
    .layer(toolshield_test::BareTool);
    for (tool, n) in [(hostile, 3), ("plain", 1)] {
        for _ in 0..n {
            let req = ToolRequest::new(tool, json!({}));
            svc.ready().await.unwrap().call(req).await.unwrap();
        }
    }
    let text = exporter.render();
    let exp = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let count = "tool_duration_seconds_count";
    assert_eq!(
        exp.series(count),
        expect(&[
            (&[("tool", hostile), ("status", "success")], 3.0),
            (&[("tool", "plain"), ("status", "success")], 1.0),
        ])
    );
    assert_eq!(
        exp.value(
            "tool_duration_seconds_bucket",
            &[("tool", hostile), ("status", "success"), ("le", "+Inf")]
        ),
        Some(3.0)
    );
    assert_eq!(
        exp.types.get("tool_duration_seconds").map(String::as_str),
        Some("histogram")
    );
    assert_eq!(
        text.matches("# TYPE tool_duration_seconds ").count(),
        1,
        "one family"
    );
}

#[tokio::test(start_paused = true)]
async fn tool_names_differing_in_escaped_characters_stay_distinct_series() {
    // Registered names a naive escaper confuses: a backslash before a quote, a backslash,
    // a newline or another character, and a very long name. Each keeps its own series,
    // and every label value parses back to the name exactly.
    let long = "x\\\"\n".repeat(2_000);
    let names: Vec<&str> = vec![
        "a\"b", "a\\\"b", "a\\b", "a\\\\b", "a\nb", "a\\\nb", "a\\nb", "tail\\", &long,
    ];
    let exporter = local_prometheus();
    let mut svc = MetricsLayer::build(
        MetricsConfig::with_tools(names.iter().copied()),
        exporter.target(),
    )
    .unwrap()
    .layer(toolshield_test::BareTool);
    for (i, tool) in names.iter().enumerate() {
        for _ in 0..=i {
            let req = ToolRequest::new(*tool, json!({}));
            svc.ready().await.unwrap().call(req).await.unwrap();
        }
    }
    let text = exporter.render();
    let exp = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    for family in ["tool_execution_total", "tool_duration_seconds_count"] {
        let want: BTreeMap<Labels, f64> = names
            .iter()
            .enumerate()
            .map(|(i, t)| {
                (
                    labels_of(&[("tool", t), ("status", "success")]),
                    (i + 1) as f64,
                )
            })
            .collect();
        assert_eq!(exp.series(family), want, "{family}");
    }
}

#[tokio::test(start_paused = true)]
async fn gauge_and_histogram_label_values_differing_in_backslashes_stay_distinct_series() {
    // The breaker collector's gauges and any other histogram go through the recorder too:
    // keys (caller ids with a per-caller key function) that differ only in backslashes
    // keep their own series.
    use metrics::{Key, Label};
    let exporter = local_prometheus();
    let target = exporter.target();
    let keys = ["k\\\"x", "k\"x", "k\\\\x", "k\\x"];
    for (i, k) in keys.iter().enumerate() {
        let labels = vec![Label::new("key", (*k).to_owned())];
        target
            .gauge(&Key::from_parts("hostile_gauge", labels.clone()))
            .set((i + 1) as f64);
        target
            .histogram(&Key::from_parts("hostile_histogram", labels))
            .record((i + 1) as f64);
    }
    let text = exporter.render();
    let exp = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let want: BTreeMap<Labels, f64> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (labels_of(&[("key", k)]), (i + 1) as f64))
        .collect();
    assert_eq!(exp.series("hostile_gauge"), want);
    assert_eq!(exp.series("hostile_histogram_sum"), want);
}
