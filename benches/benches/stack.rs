//! The full default stack on a success that misses the cache (telemetry on, in-memory
//! stores) against the bare service and against a comparable tower-resilience stack
//! (time limiter + retry + circuit breaker + cache), in one group.
//!
//! Every entry builds one fresh `ToolRequest` per call with a distinct ~200-byte payload,
//! so the cache misses and the payload digest is computed each time, as on a real miss.
//! Three more entries run the pipelines without a cache: the same stack for a read-only
//! tool without one, toolshield's retry + breaker + attempt timeout alone (composed with
//! `ServiceBuilder`), and tower-resilience's time limiter + retry + circuit breaker.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use serde_json::Value;
use tokio::runtime::Runtime;
use toolshield::prelude::*;
use toolshield_benches::{payload_200b, BareTool};
use toolshield_breaker::{BreakerLayer, BreakerRegistry};
use toolshield_retry::{RetryConfig, RetryLayer};
use toolshield_timeout::TimeoutLayer;
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

/// What every entry of the group shares: the runtime and the source of fresh requests.
struct Calls {
    rt: Runtime,
    counter: AtomicU64,
    base: Value,
}

impl Calls {
    /// One entry: `svc` cloned for each call (as a task does), then called with a fresh
    /// request for `tool`.
    fn entry<S>(&self, group: &mut BenchmarkGroup<'_, WallTime>, name: &str, svc: &S, tool: &str)
    where
        S: Service<ToolRequest, Response = ToolResponse> + Clone,
        S::Error: std::fmt::Debug,
    {
        group.bench_function(name, |b| {
            b.to_async(&self.rt).iter(|| {
                let mut svc = svc.clone();
                let req = next_request(tool, &self.counter, &self.base);
                async move { call(&mut svc, req).await }
            })
        });
    }
}

fn new_shield() -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(CONFIG).expect("config")).expect("shield")
}

fn stack(c: &mut Criterion) {
    let calls = Calls {
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime"),
        counter: AtomicU64::new(0),
        base: payload_200b(),
    };
    let _guard = calls.rt.enter();
    let mut group = c.benchmark_group("full_stack_cache_miss_success");

    calls.entry(&mut group, "bare", &BareTool, "weather");

    let exporter = toolshield::metrics::local_prometheus();
    let shield = new_shield().with_metrics(&exporter).expect("metrics");
    let shielded = shield.wrap("weather", BareTool);
    calls.entry(&mut group, "toolshield_default_stack", &shielded, "weather");

    // The same stack for a read-only tool without a cache: what the budget's comparison
    // with Polly's standard pipeline (which has no cache) measures.
    let uncached = shield.wrap("quote", BareTool);
    calls.entry(
        &mut group,
        "toolshield_default_stack_no_cache",
        &uncached,
        "quote",
    );

    // Where the default stack's time goes past the pipeline: the same stack without an
    // exporter (the metrics layer records into no recorder), and without the response
    // digest as well.
    let quiet = new_shield().wrap("quote", BareTool);
    calls.entry(
        &mut group,
        "toolshield_default_stack_no_cache_no_exporter",
        &quiet,
        "quote",
    );
    let undigested = new_shield()
        .with_provenance(toolshield::provenance::ProvenanceLayer::new().digest(false))
        .wrap("quote", BareTool);
    calls.entry(
        &mut group,
        "toolshield_default_stack_no_cache_no_exporter_no_digest",
        &undigested,
        "quote",
    );

    // The same three layers as the peer's pipeline (retry around breaker around the
    // attempt timeout), composed with `ServiceBuilder` from toolshield's crates: no
    // metrics, tracing, provenance, cancel or cache; what separates the default stack's
    // pipeline from the features the peer does not have.
    let pipeline = tower::ServiceBuilder::new()
        .layer(RetryLayer::from_config(&RetryConfig::default()).expect("retry"))
        .layer(BreakerLayer::new(BreakerRegistry::default()))
        .layer(TimeoutLayer::new(Duration::from_secs(30)))
        .service(BareTool);
    calls.entry(
        &mut group,
        "toolshield_pipeline_no_cache",
        &pipeline,
        "quote",
    );

    // tower-resilience, cached and not: time limiter + retry + breaker (+ cache).
    let peer = peer::stack();
    calls.entry(&mut group, "tower_resilience_stack", &peer, "weather");
    let peer_pipeline = peer::pipeline();
    calls.entry(
        &mut group,
        "tower_resilience_no_cache",
        &peer_pipeline,
        "quote",
    );
    group.finish();

    // What each entry pays once per call before calling: a clone of the service, and its
    // drop.
    let mut clones = c.benchmark_group("stack_clone_and_drop");
    clones.bench_function("toolshield_default_stack_no_cache", |b| {
        b.iter(|| drop(black_box(uncached.clone())))
    });
    clones.bench_function("toolshield_pipeline_no_cache", |b| {
        b.iter(|| drop(black_box(pipeline.clone())))
    });
    clones.bench_function("tower_resilience_no_cache", |b| {
        b.iter(|| drop(black_box(peer_pipeline.clone())))
    });
    clones.finish();
}

criterion_group!(benches, stack);
criterion_main!(benches);
