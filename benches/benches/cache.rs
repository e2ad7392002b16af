//! Cache and idempotency paths against the bare service and tower-resilience's cache.
//!
//! Every iteration builds a fresh `ToolRequest` (so the payload digest, the key hashing,
//! is computed in the measured path), in the baseline too. One group hits a single entry
//! from one thread and from two at once: what a hot key costs when workers share it.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use toolshield_benches::{payload_200b, BareTool};
use toolshield_cache::{CacheConfig, CacheLayer};
use toolshield_core::{CallKind, ToolRequest};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer};
use toolshield_test::call_blocking;
use tower::{Layer, Service, ServiceExt};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

fn read(payload: &serde_json::Value) -> ToolRequest {
    ToolRequest::new("weather", payload.clone()).kind(CallKind::ReadOnly)
}

/// One call of `svc` with `payload`, so that the entry is cached before the hits.
fn warm_up<S>(rt: &tokio::runtime::Runtime, svc: &mut S, payload: &serde_json::Value)
where
    S: Service<ToolRequest>,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        svc.ready()
            .await
            .expect("ready")
            .call(read(payload))
            .await
            .expect("warm")
    });
}

fn cache_hit(c: &mut Criterion) {
    let rt = rt();
    let payload = payload_200b();
    let mut g = c.benchmark_group("cache_hit");

    let mut bare = BareTool::new();
    g.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| {
            let req = read(&payload);
            let fut = bare.call(req);
            async move { black_box(fut.await) }
        })
    });

    // What the key alone costs: canonical JSON (RFC 8785) + SHA-256 of a 200-byte payload.
    g.bench_function("key-hashing-only", |b| {
        b.iter(|| black_box(read(&payload).cache_key()))
    });

    let layer = CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(3600)))
        .expect("config");
    let mut svc = layer.layer(BareTool::new());
    warm_up(&rt, &mut svc, &payload);
    g.bench_function("toolshield", |b| {
        b.to_async(&rt).iter(|| {
            let req = read(&payload);
            let fut = svc.call(req);
            async move {
                let r = fut.await;
                debug_assert!(r.as_ref().is_ok_and(|r| r.provenance.cache_hit));
                black_box(r)
            }
        })
    });

    // tower-resilience with a comparable key: the same `{tool}:{sha256(canonical)}`.
    let peer = tower_resilience::cache::CacheLayer::builder()
        .max_size(10_000)
        .ttl(Duration::from_secs(3600))
        .key_extractor(|req: &ToolRequest| req.cache_key().unwrap_or_default())
        .build()
        .expect("peer config");
    let mut psvc = peer.layer(BareTool::new());
    warm_up(&rt, &mut psvc, &payload);
    g.bench_function("tower-resilience", |b| {
        b.to_async(&rt).iter(|| {
            let req = read(&payload);
            let fut = psvc.call(req);
            async move { black_box(fut.await) }
        })
    });
    g.finish();
}

/// One hot entry hit from `threads` threads at once, each with its own service (clones
/// of one layer share the store) and its own requests: time per hit on the slowest.
fn hot_entry_threads(c: &mut Criterion) {
    let rt = rt();
    let payload = payload_200b();
    let layer = CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(3600)))
        .expect("config");
    warm_up(&rt, &mut layer.layer(BareTool::new()), &payload);
    let mut g = c.benchmark_group("cache_hit_hot_entry_threads");
    for threads in [1usize, 2] {
        g.bench_function(format!("toolshield/{threads}"), |b| {
            b.iter_custom(|iters| {
                // The threads start hitting together, not as each is spawned.
                let barrier = std::sync::Barrier::new(threads);
                std::thread::scope(|s| {
                    let workers: Vec<_> = (0..threads)
                        .map(|_| {
                            let mut svc = layer.layer(BareTool::new());
                            let payload = payload.clone();
                            let barrier = &barrier;
                            s.spawn(move || {
                                barrier.wait();
                                let start = Instant::now();
                                for _ in 0..iters {
                                    let hit = call_blocking(&mut svc, read(&payload));
                                    debug_assert!(hit.is_ok_and(|r| r.provenance.cache_hit));
                                }
                                start.elapsed()
                            })
                        })
                        .collect();
                    workers
                        .into_iter()
                        .map(|w| w.join().expect("worker"))
                        .max()
                        .unwrap_or_default()
                })
            })
        });
    }
    g.finish();
}

fn cache_miss(c: &mut Criterion) {
    let rt = rt();
    let mut g = c.benchmark_group("cache_miss");
    let mut n = 0u64;
    let mut next = move || {
        n += 1;
        ToolRequest::new("weather", json!({"city": "Paris", "n": n})).kind(CallKind::ReadOnly)
    };

    let mut bare = BareTool::new();
    g.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| {
            let fut = bare.call(next());
            async move { black_box(fut.await) }
        })
    });

    let layer = CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(3600)))
        .expect("config");
    let mut svc = layer.layer(BareTool::new());
    g.bench_function("toolshield", |b| {
        b.to_async(&rt).iter(|| {
            let fut = svc.call(next());
            async move { black_box(fut.await) }
        })
    });
    g.finish();
}

/// A mutation of the bare tool through the idempotency layer against the bare tool alone,
/// in group `name`: the n-th call's key is `key(n)`. With `replayed`, a first call writes
/// the record and every measured call must be answered from it; else every call must run.
fn idempotent_group(c: &mut Criterion, name: &str, key: impl Fn(u64) -> Arc<str>, replayed: bool) {
    let rt = rt();
    let payload = json!({"amount": 42, "currency": "EUR", "to": "acct_123"});
    let mut n = 0u64;
    let mut pay = move |p: &serde_json::Value| {
        n += 1;
        ToolRequest::new("pay", p.clone())
            .kind(CallKind::Mutating)
            .idempotency_key(key(n))
    };
    let mut g = c.benchmark_group(name);

    let mut bare = BareTool::new();
    g.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| {
            let fut = bare.call(pay(&payload));
            async move { black_box(fut.await) }
        })
    });

    let layer = IdempotencyLayer::new(IdempotencyConfig::default()).expect("config");
    let mut svc = layer.layer(BareTool::new());
    if replayed {
        rt.block_on(async {
            svc.ready()
                .await
                .expect("ready")
                .call(pay(&payload))
                .await
                .expect("first")
        });
    }
    g.bench_function("toolshield", |b| {
        b.to_async(&rt).iter(|| {
            let fut = svc.call(pay(&payload));
            async move {
                let r = fut.await;
                debug_assert!(r.as_ref().is_ok_and(|r| r.provenance.replayed == replayed));
                black_box(r)
            }
        })
    });
    g.finish();
}

/// A replay: every call under one key whose record is written.
fn idempotent_replay(c: &mut Criterion) {
    idempotent_group(c, "idempotent_replay", |_| Arc::from("order-7"), true);
}

/// The first execution of a mutation under a fresh idempotency key, in memory: the claim,
/// the call, and the COMPLETED record written (with the payload kept beside it); once the
/// store is full, each write also evicts an older record.
fn idempotent_first_execution(c: &mut Criterion) {
    idempotent_group(
        c,
        "idempotent_first_execution",
        |n| Arc::from(format!("order-{n}")),
        false,
    );
}

criterion_group!(
    benches,
    cache_hit,
    hot_entry_threads,
    cache_miss,
    idempotent_replay,
    idempotent_first_execution
);
criterion_main!(benches);
