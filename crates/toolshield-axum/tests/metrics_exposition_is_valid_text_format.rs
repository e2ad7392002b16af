//! `GET /metrics` scraped over HTTP from a real server after calls with tool names and
//! breaker keys chosen to break a careless writer (quotes, backslashes, line feeds,
//! non-ASCII, a 10 KB name), checked with a strict reader of the Prometheus text
//! exposition format 0.0.4 written here: one `# HELP` and one `# TYPE` per family before
//! its samples, a family's lines in one group, metric and label names of the grammar,
//! only the escapes the format defines, counters named `_total`, histograms with
//! cumulative buckets ending in `le="+Inf"` equal to `_count` and a `_sum`, no series
//! twice. The label sets stay bounded whatever callers send, and no payload value,
//! caller id or trace id becomes a label.

mod support;

use std::collections::BTreeSet;

use serde_json::json;
use toolshield::collectors::BreakerMetrics;
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_axum::ShieldRouter;
use toolshield_breaker::{BreakerConfig, BreakerRegistry};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::{local_prometheus, PROMETHEUS_CONTENT_TYPE};
use tower::{service_fn, ServiceExt};

use support::{request, serve};
use toolshield_test::exposition::parse;

/// Names a careless writer would break.
fn awkward_names() -> Vec<String> {
    vec![
        "plain".to_owned(),
        "we\"ather".to_owned(),
        "back\\slash".to_owned(),
        "a\\\"b".to_owned(),
        "a\"b".to_owned(),
        "a\\\\b".to_owned(),
        "a\\b".to_owned(),
        "line\nfeed".to_owned(),
        "trailing\\".to_owned(),
        "ünïcødé-€-天気".to_owned(),
        "x".repeat(10 * 1024),
    ]
}

const SECRET: &str = "SECRET-PAYLOAD-VALUE";
const CALLER: &str = "alice@example.com";
const TRACE: &str = "trace-of-alice";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_awkward_tool_names_parse_strictly_and_stay_bounded() {
    let exporter = local_prometheus();
    let shield = Shield::from_config(ShieldConfig::default())
        .unwrap()
        .with_metrics(&exporter)
        .unwrap();
    // The router refuses names with control characters and overlong ones: those are
    // called below as names no route holds.
    let (names, refused): (Vec<String>, Vec<String>) = awkward_names()
        .into_iter()
        .partition(|n| !n.contains('\n') && n.len() <= 256);
    assert_eq!(refused.len(), 2);
    let mut builder = shield.router();
    for name in &names {
        builder = builder.tool(
            name,
            service_fn(|req: ToolRequest| async move {
                if req.payload()["fail"].as_bool() == Some(true) {
                    Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
                } else {
                    Ok(ToolResponse::new(json!({ "echo": req.payload().clone() })))
                }
            }),
        );
    }
    let tools = builder.build().unwrap();
    let call = |tool: String, fail: bool| {
        let tools = tools.clone();
        async move {
            let req = ToolRequest::new(tool, json!({ "secret": SECRET, "fail": fail }))
                .kind(CallKind::ReadOnly)
                .caller(CALLER)
                .trace_id(TRACE);
            tools.oneshot(req).await
        }
    };
    for name in &names {
        call(name.clone(), false).await.unwrap();
        call(name.clone(), false).await.unwrap();
    }
    // Failures enough to open the breaker of one awkward name.
    for _ in 0..10 {
        let _ = call("we\"ather".to_owned(), true).await;
    }
    // Names no route holds, as a confused model would invent them.
    for name in &refused {
        assert_eq!(
            call(name.clone(), false).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
    for i in 0..2_000 {
        let err = call(format!("invented\"\\\n{i}-{SECRET}"), false)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
    }

    let ops = ShieldRouter::new()
        .metrics(exporter)
        .breakers(shield.breakers())
        .build();
    let addr = serve(ops).await;
    let a = request("GET", format!("http://{addr}/metrics"), None).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.content_type, PROMETHEUS_CONTENT_TYPE);
    let exp = parse(&a.body).unwrap_or_else(|e| panic!("invalid exposition: {e}"));

    for family in [
        "tool_execution_total",
        "tool_duration_seconds",
        "circuit_breaker_state",
    ] {
        assert!(exp.types.contains_key(family), "no `{family}`");
    }
    // Every name is a series of its own, with its exact count.
    for name in &names {
        let successes = exp.value(
            "tool_execution_total",
            &[("tool", name), ("status", "success")],
        );
        assert_eq!(
            successes,
            Some(2.0),
            "tool {:?}",
            &name[..name.len().min(20)]
        );
        assert_eq!(
            exp.value(
                "tool_duration_seconds_count",
                &[("tool", name), ("status", "success")]
            ),
            Some(2.0)
        );
    }
    let open = exp.value(
        "circuit_breaker_state",
        &[("key", "we\"ather"), ("state", "open")],
    );
    assert_eq!(open, Some(1.0));
    // Bounded: the registered names and `other`, nothing a caller chose.
    let allowed: BTreeSet<String> = names.iter().cloned().chain(["other".to_owned()]).collect();
    for (family, label) in [("tool_", "tool"), ("circuit_breaker_", "key")] {
        let values = exp.label_values(family, label);
        assert!(
            values.is_subset(&allowed),
            "{label}: {:?}",
            values.difference(&allowed).collect::<Vec<_>>()
        );
    }
    for leak in [SECRET, CALLER, TRACE, "invented"] {
        assert!(!a.body.contains(leak), "`{leak}` in /metrics");
    }
}

/// Breaker keys chosen per caller: a hand-built collector names at most its limit, every
/// other key is `other`, and the awkward ones are written exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_many_awkward_breaker_keys_parse_strictly_and_stay_bounded() {
    let exporter = local_prometheus();
    let config = BreakerConfig {
        max_keys: 20_000,
        ..BreakerConfig::default()
    };
    let registry = BreakerRegistry::new(config.clone()).unwrap();
    let second = BreakerRegistry::new(config).unwrap();
    let names = awkward_names();
    for key in names
        .iter()
        .filter(|k| k.len() <= toolshield_breaker::MAX_KEY_LEN)
    {
        registry.force_open(key);
        second.force_closed(key);
    }
    for i in 0..5_000 {
        registry.reset(&format!("caller-{i}\"\\\n"));
    }
    exporter.add_collector(BreakerMetrics::new(registry, exporter.target()).max_named_keys(100));
    exporter.add_collector(BreakerMetrics::new(second, exporter.target()).max_named_keys(100));
    let addr = serve(ShieldRouter::new().metrics(exporter).build()).await;
    let a = request("GET", format!("http://{addr}/metrics"), None).await;
    assert_eq!(a.content_type, PROMETHEUS_CONTENT_TYPE);
    let exp = parse(&a.body).unwrap_or_else(|e| panic!("invalid exposition: {e}"));
    let keys = exp.label_values("circuit_breaker_state", "key");
    assert!(keys.len() <= 2 * 100 + 1, "{} keys", keys.len());
    assert!(keys.contains("other"));
    for key in names
        .iter()
        .filter(|k| k.len() <= toolshield_breaker::MAX_KEY_LEN)
    {
        assert!(keys.contains(key), "{key:?} not named");
    }
}

/// A stack with a cache, idempotency, a schema and two breaker registries: the families
/// the documents promise are there, each family once, and the whole text parses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_a_configured_stack_have_the_promised_families_once_each() {
    let config = ShieldConfig::from_toml_str(
        r#"
[tools.weather]
kind = "read_only"
cache = { ttl = "5m" }

[tools.search]
kind = "read_only"
breaker = { consecutive_failures = 1 }

[tools.pay]
kind = "mutating"

[tools.pay.schema]
type = "object"
required = ["amount"]

[tools.pay.schema.properties.amount]
type = "integer"
"#,
    )
    .unwrap();
    let exporter = local_prometheus();
    let shield = Shield::from_config(config)
        .unwrap()
        .with_metrics(&exporter)
        .unwrap();
    assert!(
        shield.breakers().len() >= 2,
        "{:?}",
        shield.breakers().keys()
    );
    let ok = || {
        service_fn(|req: ToolRequest| async move {
            if req.tool() == "search" {
                Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
            } else {
                Ok(ToolResponse::new(json!({"ok": true})))
            }
        })
    };
    let tools = shield
        .router()
        .tool("weather", ok())
        .tool("search", ok())
        .tool("pay", ok())
        .build()
        .unwrap();
    let call = |tool: &'static str, payload: serde_json::Value, key: Option<&'static str>| {
        let tools = tools.clone();
        async move {
            let mut req = ToolRequest::new(tool, payload)
                .caller(CALLER)
                .trace_id(TRACE);
            if let Some(k) = key {
                req = req.idempotency_key(k);
            }
            tools.oneshot(req).await
        }
    };
    for _ in 0..3 {
        call("weather", json!({"city": SECRET}), None)
            .await
            .unwrap();
        let _ = call("search", json!({"q": SECRET}), None).await;
        call("pay", json!({"amount": 5}), Some("order-1"))
            .await
            .unwrap();
    }
    let invalid = call("pay", json!({"amount": SECRET}), Some("order-2")).await;
    assert_eq!(invalid.unwrap_err().kind(), ErrorKind::InvalidInput);

    let ops = ShieldRouter::new()
        .metrics(exporter)
        .breakers(shield.breakers())
        .build();
    let addr = serve(ops).await;
    let a = request("GET", format!("http://{addr}/metrics"), None).await;
    assert_eq!(a.content_type, PROMETHEUS_CONTENT_TYPE);
    let exp = parse(&a.body).unwrap_or_else(|e| panic!("invalid exposition: {e}"));
    for (family, kind) in [
        ("tool_execution_total", "counter"),
        ("tool_duration_seconds", "histogram"),
        ("circuit_breaker_state", "gauge"),
        ("circuit_breaker_transitions_total", "counter"),
        ("idempotency_cache_hits_total", "counter"),
        ("tool_cache_hits_total", "counter"),
        ("tool_errors_total", "counter"),
    ] {
        assert_eq!(
            exp.types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    assert_eq!(
        exp.value("tool_cache_hits_total", &[("tool", "weather")]),
        Some(2.0)
    );
    assert_eq!(
        exp.value("idempotency_cache_hits_total", &[("tool", "pay")]),
        Some(2.0)
    );
    assert_eq!(
        exp.value(
            "circuit_breaker_state",
            &[("key", "search"), ("state", "open")]
        ),
        Some(1.0)
    );
    assert_eq!(
        exp.value(
            "tool_errors_total",
            &[("tool", "pay"), ("code", "INVALID_INPUT")]
        ),
        Some(1.0)
    );
    for leak in [SECRET, CALLER, TRACE, "order-1"] {
        assert!(!a.body.contains(leak), "`{leak}` in /metrics");
    }
}
