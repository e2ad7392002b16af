//! Circuit breaker, closed state, admit + record: the bare service, toolshield's breaker
//! and the breakers of recloser, failsafe and tower-resilience in one group; the same on
//! two threads sharing one hot key; a full registry of unevictable breakers, a known key
//! against a new key; and the memory one breaker takes.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::hint::black_box;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use std::future::{ready, Ready};

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::Value;
use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry};
use toolshield_core::{CallKind, ShieldRequest, ToolError, ToolResponse};
use toolshield_test::{block_on, call_blocking};
use tower::{Layer, Service};

/// A request that costs nothing to build and drop, so the group measures the breakers
/// and not the request (a `ToolRequest` clone touches two cancellation tokens, whose
/// shared lock would dominate the two-thread figures).
#[derive(Clone)]
struct LiteRequest {
    /// The tool name, and so the breaker key.
    key: Arc<str>,
}

impl LiteRequest {
    fn new(key: impl Into<Arc<str>>) -> Self {
        LiteRequest { key: key.into() }
    }
}

impl Default for LiteRequest {
    fn default() -> Self {
        LiteRequest::new("weather")
    }
}

impl ShieldRequest for LiteRequest {
    fn call_name(&self) -> Option<&str> {
        Some(&self.key)
    }
    fn call_kind(&self) -> Option<CallKind> {
        Some(CallKind::ReadOnly)
    }
}

/// The baseline tool: answers at once.
#[derive(Clone, Copy, Default)]
struct BareTool;

impl Service<LiteRequest> for BareTool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: LiteRequest) -> Self::Future {
        ready(Ok(ToolResponse::new(Value::Bool(true))))
    }
}

type ToolRequest = LiteRequest;

/// One call through `svc` (readiness, call, await), asserting success.
fn call<S>(svc: &mut S, req: &ToolRequest)
where
    S: Service<ToolRequest>,
    S::Error: std::fmt::Debug,
{
    let res = call_blocking(svc, req.clone());
    assert!(res.is_ok());
}

fn recloser_new() -> recloser::Recloser {
    recloser::Recloser::custom()
        .error_rate(0.5)
        .closed_len(100)
        .half_open_len(1)
        .open_wait(Duration::from_secs(30))
        .build()
}

fn failsafe_new() -> impl failsafe::CircuitBreaker + Clone + Send + Sync {
    let backoff = failsafe::backoff::constant(Duration::from_secs(30));
    failsafe::Config::new()
        .failure_policy(failsafe::failure_policy::consecutive_failures(5, backoff))
        .build()
}

fn closed_admit_record(c: &mut Criterion) {
    let req = LiteRequest::default();
    let mut g = c.benchmark_group("breaker_closed_admit_record");

    let mut bare = BareTool;
    g.bench_function("bare", |b| b.iter(|| call(&mut bare, black_box(&req))));

    let mut ours = BreakerLayer::new(BreakerRegistry::default()).layer(BareTool);
    g.bench_function("toolshield", |b| {
        b.iter(|| call(&mut ours, black_box(&req)))
    });

    let mut pinned = BreakerLayer::new(BreakerRegistry::default())
        .pin_key("weather")
        .layer(BareTool);
    g.bench_function("toolshield_pinned", |b| {
        b.iter(|| call(&mut pinned, black_box(&req)))
    });

    let rec = recloser_new();
    let mut inner = BareTool;
    g.bench_function("recloser", |b| {
        b.iter(|| {
            let r = rec.call(|| {
                let _ = inner.poll_ready(&mut Context::from_waker(Waker::noop()));
                block_on(inner.call(black_box(&req).clone()))
            });
            assert!(r.is_ok());
        })
    });

    let fs = failsafe_new();
    let mut inner = BareTool;
    g.bench_function("failsafe", |b| {
        b.iter(|| {
            let r = failsafe::CircuitBreaker::call(&fs, || {
                let _ = inner.poll_ready(&mut Context::from_waker(Waker::noop()));
                block_on(inner.call(black_box(&req).clone()))
            });
            assert!(r.is_ok());
        })
    });

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _enter = rt.enter();
    let mut peer = tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .build()
        .expect("valid peer config")
        .layer(BareTool);
    g.bench_function("tower-resilience", |b| {
        b.iter(|| call(&mut peer, black_box(&req)))
    });
    g.finish();
}

/// Time per call on each of `threads` threads running `iters` calls each at once.
fn on_threads<F>(threads: usize, iters: u64, make: impl Fn() -> F) -> Duration
where
    F: FnMut() + Send,
{
    let workers: Vec<F> = (0..threads).map(|_| make()).collect();
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|mut work| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        work();
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .max()
            .unwrap_or_default()
    })
}

/// Each thread builds its own request (the same key in its own allocation): the threads
/// then share the breaker and nothing else, as tasks with their own requests do.
fn hot_key_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("breaker_hot_key_threads");
    let registry = BreakerRegistry::default();
    let rec = std::sync::Arc::new(recloser_new());
    let fs = failsafe_new();
    for threads in [1usize, 2] {
        g.bench_function(format!("toolshield/{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, || {
                    let mut svc = BreakerLayer::new(registry.clone()).layer(BareTool);
                    let req = LiteRequest::default();
                    move || call(&mut svc, &req)
                })
            })
        });
        // The breaker as the default stack holds it: pinned to the tool's key when the
        // service is built.
        g.bench_function(format!("toolshield_pinned/{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, || {
                    let mut svc = BreakerLayer::new(registry.clone())
                        .pin_key("weather")
                        .layer(BareTool);
                    let req = LiteRequest::default();
                    move || call(&mut svc, &req)
                })
            })
        });
        g.bench_function(format!("recloser/{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, || {
                    let (rec, req, mut inner) = (rec.clone(), LiteRequest::default(), BareTool);
                    move || {
                        let r = rec.call(|| block_on(inner.call(req.clone())));
                        assert!(r.is_ok());
                    }
                })
            })
        });
        g.bench_function(format!("failsafe/{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, || {
                    let (fs, req, mut inner) = (fs.clone(), LiteRequest::default(), BareTool);
                    move || {
                        let r = failsafe::CircuitBreaker::call(&fs, || {
                            block_on(inner.call(req.clone()))
                        });
                        assert!(r.is_ok());
                    }
                })
            })
        });
    }
    g.finish();
}

/// A registry holding `max_keys` = 10,000 breakers none of which can be evicted: 9,998
/// forced open, and the two keys the known-key entry alternates between, forced closed
/// (they admit and record every call, and a sweep keeps them).
fn full_registry() -> BreakerRegistry {
    const KEYS: usize = 10_000;
    let registry = BreakerRegistry::new(BreakerConfig {
        max_keys: KEYS,
        ..BreakerConfig::default()
    })
    .expect("valid config");
    for i in 0..KEYS - 2 {
        registry.force_open(&format!("open-{i}"));
    }
    registry.force_closed("known-a");
    registry.force_closed("known-b");
    assert_eq!(registry.len(), KEYS);
    registry
}

fn full_registry_new_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("breaker_full_registry");
    let registry = full_registry();
    let known = [LiteRequest::new("known-a"), LiteRequest::new("known-b")];

    let mut bare = BareTool;
    g.bench_function("bare", |b| {
        b.iter_batched(
            || known[0].clone(),
            |req| call(&mut bare, black_box(&req)),
            BatchSize::SmallInput,
        )
    });

    // Two keys in turn, so each call misses the service's one-key cache and looks the
    // key up in the registry.
    let mut svc = BreakerLayer::new(registry.clone()).layer(BareTool);
    let mut turn = 0usize;
    g.bench_function("known key", |b| {
        b.iter_batched(
            || {
                turn += 1;
                known[turn % 2].clone()
            },
            |req| call(&mut svc, black_box(&req)),
            BatchSize::SmallInput,
        )
    });

    // A key never seen before on every call: the registry is full and nothing can be
    // evicted, so each call runs under a breaker that is not kept.
    let mut svc = BreakerLayer::new(registry.clone()).layer(BareTool);
    let mut n = 0u64;
    g.bench_function("new key", |b| {
        b.iter_batched(
            || {
                n += 1;
                LiteRequest::new(format!("new-{n}"))
            },
            |req| call(&mut svc, black_box(&req)),
            BatchSize::SmallInput,
        )
    });
    g.finish();
    assert_eq!(registry.len(), 10_000, "nothing was evicted");
    println!("calls that overflowed: {}", registry.overflowed());
}

fn memory(_c: &mut Criterion) {
    let registry = BreakerRegistry::default();
    println!(
        "memory per breaker (100-call window, state + window): toolshield {} bytes; \
         recloser size_of {} bytes + its ring buffer on the heap",
        registry.memory_per_breaker(),
        std::mem::size_of::<recloser::Recloser>(),
    );
}

criterion_group!(
    benches,
    memory,
    closed_admit_record,
    hot_key_threads,
    full_registry_new_key
);
criterion_main!(benches);
