//! The full default stack under concurrency: a multi-threaded runtime with 2 workers and
//! 64 tasks calling at once, on one tool (one breaker, one cache, one set of series
//! shared by every task) and on 64 tools (one each), against the bare service and against
//! tower-resilience's time limiter + retry + circuit breaker + cache in the same group.
//!
//! Each criterion iteration is one call (`Throughput::Elements(1)`, so criterion reports
//! calls per second); an iteration batch is split evenly over the 64 tasks, which run
//! concurrently on the two workers. Every call builds a fresh `ToolRequest` with a
//! distinct ~200-byte payload, so every cache misses, as in `--bench stack`: each task
//! of each batch takes a number of its own (`TASK_IDS`), and its calls are numbered
//! under it, so no payload repeats across batches either (with numbers that restarted
//! at each batch, the small ones came back every batch and hit the caches, at rates that
//! depended on each cache's eviction).

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::Value;
use toolshield::prelude::*;
use toolshield_benches::{payload_200b, BareTool};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

#[path = "common/peer.rs"]
mod peer;

/// Concurrent tasks per batch.
const TASKS: u64 = 64;

/// A number for each task of each batch, taken once per task: payloads never repeat.
static TASK_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

const CONFIG: &str = r#"
[defaults]
timeout = { attempt = "30s", soft = "2s", total = "60s" }
kind = "read_only"
cache = { ttl = "10m" }
"#;

/// A service as every entry runs it: cloned per call, like a shared client.
type Svc = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

/// The tool names of `n` tools.
fn tools(n: usize) -> Vec<Arc<str>> {
    (0..n).map(|i| Arc::from(format!("tool{i}"))).collect()
}

/// Runs `iters` calls split over [`TASKS`] concurrent tasks; task `t` calls
/// `services[t % services.len()]` as tool `names[t % names.len()]`. Returns the wall time.
async fn run(services: Arc<Vec<Svc>>, names: Arc<Vec<Arc<str>>>, iters: u64) -> Duration {
    let base = Arc::new(payload_200b());
    let per_task = iters.div_ceil(TASKS);
    let started = Instant::now();
    let mut handles = Vec::with_capacity(TASKS as usize);
    for t in 0..TASKS {
        let (services, names, base) =
            (Arc::clone(&services), Arc::clone(&names), Arc::clone(&base));
        handles.push(tokio::spawn(async move {
            let i = usize::try_from(t).unwrap_or(0);
            let id = TASK_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut svc = services[i % services.len()].clone();
            let name = Arc::clone(&names[i % names.len()]);
            for n in 0..per_task {
                let mut payload = Value::clone(&base);
                payload["n"] = Value::from((id << 24) | n);
                let req = ToolRequest::new(&*name, payload).kind(CallKind::ReadOnly);
                let res = svc.ready().await.expect("ready").call(req).await;
                assert!(res.is_ok(), "{res:?}");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    started.elapsed()
}

/// tower-resilience's stack around the bare tool, as in `--bench stack`.
fn peer_stack() -> Svc {
    BoxCloneSyncService::new(
        peer::stack().map_err(|e| ToolError::execution_failed(format!("{e:?}"))),
    )
}

fn concurrency(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let mut group = c.benchmark_group("full_stack_2_workers_64_tasks");
    group.throughput(Throughput::Elements(1));

    let one = Arc::new(tools(1));
    let many = Arc::new(tools(usize::try_from(TASKS).unwrap_or(64)));

    let mut bench = |id: &str, services: Vec<Svc>, names: &Arc<Vec<Arc<str>>>| {
        let services = Arc::new(services);
        group.bench_function(id, |b| {
            b.to_async(&rt)
                .iter_custom(|iters| run(Arc::clone(&services), Arc::clone(names), iters));
        });
    };

    bench("bare", vec![BoxCloneSyncService::new(BareTool)], &one);

    let exporter = toolshield::metrics::local_prometheus();
    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG).expect("config"))
        .expect("shield")
        .with_metrics(&exporter)
        .expect("metrics");
    let wrap = |name: &Arc<str>| BoxCloneSyncService::new(shield.wrap(name, BareTool));
    bench("toolshield_one_tool", one.iter().map(wrap).collect(), &one);
    bench(
        "toolshield_64_tools",
        many.iter().map(wrap).collect(),
        &many,
    );

    bench("tower_resilience_one_tool", vec![peer_stack()], &one);
    bench(
        "tower_resilience_64_tools",
        many.iter().map(|_| peer_stack()).collect(),
        &many,
    );
    group.finish();
}

criterion_group!(benches, concurrency);
criterion_main!(benches);
