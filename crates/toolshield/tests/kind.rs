//! The side-effect class a tool is configured with applies to its calls: a request that
//! declares none takes it, a request that declares another keeps the stricter of the two.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield::prelude::*;
use toolshield::BoxTool;
use tower::{service_fn, ServiceExt};

const CONFIG: &str = r#"
[tools.weather]
kind = "read_only"
cache = { ttl = "5m" }

[tools.lookup]
cache = { ttl = "0s" }

[tools.search]
kind = "mutating"
"#;

/// A tool that counts its runs and reports the kind each call arrived with.
fn counting() -> (Arc<AtomicU32>, BoxTool) {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = service_fn(move |req: ToolRequest| {
        r.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, ToolError>(ToolResponse::new(json!(req.call_kind().as_str()))) }
    });
    (runs, BoxTool::new(svc))
}

#[tokio::test]
async fn a_request_without_a_kind_takes_the_configured_one() {
    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG).unwrap()).unwrap();
    let (runs, tool) = counting();
    let weather = shield.wrap("weather", tool);

    let req = || ToolRequest::new("weather", json!({"city": "Paris"}));
    let first = weather.clone().oneshot(req()).await.unwrap();
    assert_eq!(
        first.output,
        json!("read_only"),
        "the tool saw the configured kind"
    );
    let second = weather.oneshot(req()).await.unwrap();
    assert!(second.provenance.cache_hit, "a read_only call is cached");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_declared_kind_keeps_the_stricter_of_the_two() {
    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG).unwrap()).unwrap();

    // Declared mutating on a read_only tool: treated as mutating, never cached.
    let (runs, tool) = counting();
    let weather = shield.wrap("weather", tool);
    let req = |key: &str| {
        ToolRequest::new("weather", json!({"city": "Oslo"}))
            .kind(CallKind::Mutating)
            .idempotency_key(key)
    };
    let out = weather.clone().oneshot(req("first")).await.unwrap();
    assert_eq!(out.output, json!("mutating"));
    let again = weather.oneshot(req("second")).await.unwrap();
    assert!(
        !again.provenance.cache_hit,
        "a mutating call is never served from cache"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // Declared read_only on a mutating tool: still mutating.
    let (_, tool) = counting();
    let search = shield.wrap("search", tool);
    let out = search
        .oneshot(ToolRequest::new("search", json!({"q": "x"})).kind(CallKind::ReadOnly))
        .await
        .unwrap();
    assert_eq!(out.output, json!("mutating"));
}

#[tokio::test]
async fn without_a_configured_kind_the_request_decides() {
    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG).unwrap()).unwrap();
    let (_, tool) = counting();
    let lookup = shield.wrap("lookup", tool);
    let declared = lookup
        .clone()
        .oneshot(ToolRequest::new("lookup", json!({"n": 1})).kind(CallKind::Idempotent))
        .await
        .unwrap();
    assert_eq!(declared.output, json!("idempotent"));
    let undeclared = lookup
        .oneshot(ToolRequest::new("lookup", json!({"n": 2})))
        .await
        .unwrap();
    assert_eq!(
        undeclared.output,
        json!("mutating"),
        "no kind anywhere: mutating"
    );
}

#[test]
fn a_cached_tool_must_be_declared_read_only() {
    let err = ShieldConfig::from_toml_str("[tools.t]\ncache = { ttl = \"1m\" }\n").unwrap_err();
    assert!(
        err.to_string().contains(
            "tools.t.cache.ttl: only read_only tools are cached, this one is not declared"
        ),
        "{err}"
    );
}
