//! The metrics `tool` label names every tool the shield knows: the configured ones and
//! every route registered on a router, configured or not. A name nobody registered
//! never becomes a label.

use serde_json::json;
use toolshield::metrics::{local_prometheus, MetricsConfig, MetricsLayer};
use toolshield::prelude::*;
use toolshield_core::ToolService;
use tower::{service_fn, Layer, ServiceExt};

fn echo() -> impl ToolService {
    service_fn(|req: ToolRequest| async move {
        Ok::<_, ToolError>(ToolResponse::new(json!({ "tool": req.tool() })))
    })
}

fn series<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[tokio::test]
async fn a_registered_tool_without_a_section_is_counted_under_its_own_name() {
    let exporter = local_prometheus();
    let config = ShieldConfig::from_toml_str("[tools.weather]\nkind = \"read_only\"\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let shield = Shield::from_config(config)
        .and_then(|s| s.with_metrics(&exporter))
        .unwrap_or_else(|e| panic!("{e}"));
    let router = shield
        .router()
        .tool("weather", echo())
        .tool("echo", echo())
        .server("files", echo())
        .build()
        .unwrap_or_else(|e| panic!("{e}"));

    for tool in ["weather", "echo", "echo", "files__read"] {
        let req = ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly);
        router.clone().oneshot(req).await.expect("routed");
    }
    let ghost = ToolRequest::new("ghost", json!({})).kind(CallKind::ReadOnly);
    let e = router.clone().oneshot(ghost).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);

    let text = exporter.render();
    let executions = series(&text, "tool_execution_total");
    for line in [
        r#"tool_execution_total{tool="weather",status="success"} 1"#,
        r#"tool_execution_total{tool="echo",status="success"} 2"#,
        r#"tool_execution_total{tool="files",status="success"} 1"#,
    ] {
        assert!(
            executions.contains(&line),
            "{line} missing from {executions:#?}"
        );
    }
    assert_eq!(executions.len(), 3, "{executions:#?}");
    assert!(!text.contains("ghost"), "{text}");
    assert!(!text.contains("files__read"), "{text}");
    assert!(!text.contains(r#"tool="other""#), "{text}");

    // The breaker `key` label too: a registered tool is named, a key nobody registered
    // is `other`.
    let breakers = shield.breaker_for("echo");
    breakers.force_open("echo");
    breakers.force_open("ghost");
    let text = exporter.render();
    assert!(
        text.contains(r#"circuit_breaker_state{key="echo",state="forced_open"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"circuit_breaker_state{key="other",state="forced_open"} 1"#),
        "{text}"
    );
    assert!(!text.contains("ghost"), "{text}");
    breakers.reset("echo");
    breakers.reset("ghost");

    // A reload that leaves the tool unconfigured keeps its series.
    shield
        .reload(
            ShieldConfig::from_toml_str("[tools.weather]\nkind = \"read_only\"\n[tools.spare]\n")
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let req = ToolRequest::new("echo", json!({})).kind(CallKind::ReadOnly);
    router.clone().oneshot(req).await.expect("routed");
    let text = exporter.render();
    assert!(
        text.contains(r#"tool_execution_total{tool="echo",status="success"} 3"#),
        "{text}"
    );
    // and its breaker is still named.
    breakers.force_open("echo");
    let text = exporter.render();
    assert!(
        text.contains(r#"circuit_breaker_state{key="echo",state="forced_open"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_name_outside_the_registered_set_is_counted_as_other() {
    let exporter = local_prometheus();
    let layer = MetricsLayer::build(MetricsConfig::with_tools(["weather"]), exporter.target())
        .unwrap_or_else(|e| panic!("{e}"));
    let svc = layer.layer(echo());
    for tool in ["weather", "caller-chosen-1", "caller-chosen-2"] {
        let req = ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly);
        svc.clone().oneshot(req).await.expect("served");
    }
    let text = exporter.render();
    assert!(
        text.contains(r#"tool_execution_total{tool="weather",status="success"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tool_execution_total{tool="other",status="success"} 2"#),
        "{text}"
    );
    assert!(!text.contains("caller-chosen"), "{text}");
}

/// The value of the series `name{tool="<tool>"}`, 0 when the series is absent.
fn counter(text: &str, name: &str, tool: &str) -> f64 {
    let prefix = format!("{name}{{tool=\"{tool}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0.0, |v| v.trim().parse().unwrap_or(f64::NAN))
}

#[tokio::test(start_paused = true)]
async fn only_a_tool_with_a_cache_counts_cache_misses() {
    let exporter = local_prometheus();
    let config = ShieldConfig::from_toml_str(
        "[tools.weather]\nkind = \"read_only\"\ncache = { ttl = \"10m\" }\n\n\
         [tools.quote]\nkind = \"read_only\"\n\n\
         [tools.zero]\nkind = \"read_only\"\ncache = { ttl = \"0s\" }\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shield = Shield::from_config(config)
        .and_then(|s| s.with_metrics(&exporter))
        .unwrap_or_else(|e| panic!("{e}"));
    let weather = shield.wrap("weather", echo());
    let quote = shield.wrap("quote", echo());
    let zero = shield.wrap("zero", echo());
    // The same payload twice: the cached tool misses, then hits; the others run twice.
    for _ in 0..2 {
        for (svc, tool) in [(&weather, "weather"), (&quote, "quote"), (&zero, "zero")] {
            let req = ToolRequest::new(tool, json!({"q": 1})).kind(CallKind::ReadOnly);
            svc.clone().oneshot(req).await.expect("served");
        }
    }
    let text = exporter.render();
    let misses = "tool_cache_misses_total";
    let hits = "tool_cache_hits_total";
    assert_eq!(counter(&text, misses, "weather"), 1.0, "{text}");
    assert_eq!(counter(&text, hits, "weather"), 1.0, "{text}");
    for tool in ["quote", "zero"] {
        let ran = format!("tool_execution_total{{tool=\"{tool}\",status=\"success\"}} 2");
        assert!(text.contains(&ran), "{ran} missing from {text}");
        assert_eq!(counter(&text, misses, tool), 0.0, "{tool}: {text}");
        assert_eq!(counter(&text, hits, tool), 0.0, "{tool}: {text}");
    }

    // A reload that gives `quote` a cache: its stack is rebuilt with one, and counts.
    shield
        .reload(
            ShieldConfig::from_toml_str(
                "[tools.weather]\nkind = \"read_only\"\ncache = { ttl = \"10m\" }\n\n\
                 [tools.quote]\nkind = \"read_only\"\ncache = { ttl = \"10m\" }\n",
            )
            .unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..2 {
        let req = ToolRequest::new("quote", json!({"q": 2})).kind(CallKind::ReadOnly);
        quote.clone().oneshot(req).await.expect("served");
    }
    let text = exporter.render();
    assert_eq!(counter(&text, misses, "quote"), 1.0, "{text}");
    assert_eq!(counter(&text, hits, "quote"), 1.0, "{text}");
}
