//! The full default stack on a success that misses the cache (telemetry on, in-memory
//! stores) against the bare service and against a comparable tower-resilience stack
//! (time limiter + retry + circuit breaker + cache), in one group.
//!
//! Every entry builds one fresh `ToolRequest` per call with a distinct ~200-byte payload,
//! so the cache misses and the payload digest is computed each time, as on a real miss.
//! Two more entries run the pipelines without a cache: the same stack for a read-only
//! tool without one, and tower-resilience's time limiter + retry + circuit breaker.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::Value;
use toolshield::prelude::*;
use toolshield_benches::{payload_200b, BareTool};
use tower::{Service, ServiceExt};

#[path = "common/peer.rs"]
mod peer;

const CONFIG: &str = r#"
[defaults]
timeout = { attempt = "30s", soft = "2s", total = "60s" }

[tools.weather]
kind = "read_only"
cache = { ttl = "10m" }

[tools.quote]
kind = "read_only"
"#;

/// A distinct payload per call: the cache always misses.
fn next_request(tool: &str, counter: &AtomicU64, base: &Value) -> ToolRequest {
    let mut payload = base.clone();
    payload["n"] = Value::from(counter.fetch_add(1, Ordering::Relaxed));
    ToolRequest::new(tool, payload).kind(CallKind::ReadOnly)
}

async fn call<S>(svc: &mut S, req: ToolRequest)
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: std::fmt::Debug,
{
    let res = svc.ready().await.expect("ready").call(req).await;
    assert!(res.is_ok(), "{res:?}");
}

fn stack(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let base = payload_200b();
    let counter = AtomicU64::new(0);
    let mut group = c.benchmark_group("full_stack_cache_miss_success");

    group.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| {
            let req = next_request("weather", &counter, &base);
            async move { call(&mut BareTool, req).await }
        })
    });

    let exporter = toolshield::metrics::local_prometheus();
    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG).expect("config"))
        .expect("shield")
        .with_metrics(&exporter)
        .expect("metrics");
    let shielded = shield.wrap("weather", BareTool);
    group.bench_function("toolshield_default_stack", |b| {
        b.to_async(&rt).iter(|| {
            let mut svc = shielded.clone();
            let req = next_request("weather", &counter, &base);
            async move { call(&mut svc, req).await }
        })
    });

    // The same stack for a read-only tool without a cache: what the budget's comparison
    // with Polly's standard pipeline (which has no cache) measures.
    let uncached = shield.wrap("quote", BareTool);
    group.bench_function("toolshield_default_stack_no_cache", |b| {
        b.to_async(&rt).iter(|| {
            let mut svc = uncached.clone();
            let req = next_request("quote", &counter, &base);
            async move { call(&mut svc, req).await }
        })
    });

    // tower-resilience, cached and not: time limiter + retry + breaker (+ cache).
    let peer = peer::stack();
    group.bench_function("tower_resilience_stack", |b| {
        b.to_async(&rt).iter(|| {
            let mut svc = peer.clone();
            let req = next_request("weather", &counter, &base);
            async move { call(&mut svc, req).await }
        })
    });
    let peer_pipeline = peer::pipeline();
    group.bench_function("tower_resilience_no_cache", |b| {
        b.to_async(&rt).iter(|| {
            let mut svc = peer_pipeline.clone();
            let req = next_request("quote", &counter, &base);
            async move { call(&mut svc, req).await }
        })
    });
    group.finish();
}

criterion_group!(benches, stack);
criterion_main!(benches);
