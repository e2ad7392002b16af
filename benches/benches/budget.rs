//! Call budgets: the admit path (a known run, in memory) against the bare service in one
//! group, with a rejection and a call without a run id beside it, and the peers'
//! admission gates (tower's `ConcurrencyLimit` and `RateLimit`, tower-resilience's rate
//! limiter) on the same request; allocations per call
//! are counted with the counting allocator and printed first. A second group charges a
//! real redis-server (one Lua round trip) when one can be started.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use toolshield_budget::{BudgetLayer, BudgetLedger, LedgerConfig};
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_redis::testing::{unique_prefix, RedisServer};
use toolshield_redis::{RedisBudgetStore, RedisConfig, RedisConnection};
use toolshield_test::alloc::{least_of, measure, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::{call_now, BareTool};
use tower::{Layer, Service, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// One call through `svc`, returning whether it succeeded.
fn call<S>(svc: &mut S, req: &ToolRequest) -> bool
where
    S: Service<ToolRequest, Response = ToolResponse>,
{
    black_box(call_now(svc, req.clone())).is_ok()
}

/// The run id of `req`.
fn req_run(req: &ToolRequest) -> Option<&str> {
    use toolshield_core::ShieldRequest;
    req.call_meta().run_id
}

/// Allocations per call of `svc`, the least of three runs of 1,000 calls.
fn allocations<S>(svc: &mut S, req: &ToolRequest) -> f64
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    let n = least_of(3, || {
        measure(|| {
            for _ in 0..1_000 {
                call(svc, req);
            }
        })
        .1
        .allocations
    });
    n as f64 / 1_000.0
}

fn budget_admit(c: &mut Criterion) {
    let ledger = BudgetLedger::new()
        .run_max_calls(u64::MAX)
        .run_max_cost(u64::MAX);
    let mut bare = BareTool;
    let mut admit = BudgetLayer::new(&ledger, "search", Some(u64::MAX))
        .cost(1)
        .layer(BareTool);
    let mut reject = BudgetLayer::new(&ledger, "blocked", Some(0)).layer(BareTool);
    let run = ToolRequest::new("search", json!({"q": "rust"})).run_id("run-42");
    let no_run = ToolRequest::new("search", json!({"q": "rust"}));
    call(&mut admit, &run);
    call(&mut reject, &run);
    println!(
        "allocations per call: bare {:.2}, admit {:.2}, reject {:.2}, no run id {:.2}",
        allocations(&mut bare, &run),
        allocations(&mut admit, &run),
        allocations(&mut reject, &run),
        allocations(&mut admit, &no_run),
    );

    let mut group = c.benchmark_group("budget_admit");
    group.bench_function("bare", |b| b.iter(|| call(&mut bare, &run)));
    group.bench_function("budget_admit_known_run", |b| {
        b.iter(|| call(&mut admit, &run))
    });
    group.bench_function("budget_reject", |b| b.iter(|| call(&mut reject, &run)));
    group.bench_function("budget_no_run_id", |b| b.iter(|| call(&mut admit, &no_run)));
    // The floor of any per-run budget with an expiry: one clock read and one locked
    // lookup-and-increment by the run id, around the bare call.
    let floor = std::sync::Mutex::new({
        let mut m: toolshield_core::hash::FastHashMap<String, u64> = Default::default();
        m.insert("run-42".to_owned(), 0);
        m
    });
    group.bench_function("floor_clock_and_locked_lookup", |b| {
        b.iter(|| {
            let now = tokio::time::Instant::now();
            if let Some(run) = req_run(&run).and_then(|id| {
                floor.lock().ok().and_then(|mut m| {
                    m.get_mut(id).map(|n| {
                        *n += 1;
                        *n
                    })
                })
            }) {
                black_box((run, now));
            }
            call(&mut bare, &run)
        })
    });
    // The admission gates of the peers, never limited, on the same request: no peer
    // counts calls per agent run, so the fastest gate a call can pass is the bar.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _enter = rt.enter();
    let mut tower_concurrency = tower::limit::ConcurrencyLimitLayer::new(1 << 20).layer(BareTool);
    group.bench_function("tower_concurrency_limit", |b| {
        b.iter(|| call(&mut tower_concurrency, &run))
    });
    let mut tower_rate =
        tower::limit::RateLimitLayer::new(u64::MAX / 2, Duration::from_secs(1)).layer(BareTool);
    group.bench_function("tower_rate_limit", |b| {
        b.iter(|| call(&mut tower_rate, &run))
    });
    let mut resilience_rate = tower_resilience::ratelimiter::RateLimiterLayer::builder()
        .limit_for_period(usize::MAX / 2)
        .refresh_period(Duration::from_secs(1))
        .timeout_duration(Duration::ZERO)
        .build()
        .expect("valid peer config")
        .layer(BareTool);
    group.bench_function("tower-resilience_rate_limiter", |b| {
        b.iter(|| call(&mut resilience_rate, &run))
    });
    group.finish();
}

fn budget_redis(c: &mut Criterion) {
    let server = match RedisServer::start() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED the budget redis bench: no redis-server could be started ({e})");
            return;
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let conn = rt
        .block_on(RedisConnection::connect(
            RedisConfig::from_url(server.url()).with_key_prefix(unique_prefix()),
        ))
        .expect("connect");
    let ledger = BudgetLedger::with_store(
        &LedgerConfig {
            run_max_calls: Some(u64::MAX >> 12),
            ..LedgerConfig::default()
        },
        Arc::new(RedisBudgetStore::new(conn)),
    )
    .expect("ledger");
    let svc = BudgetLayer::new(&ledger, "search", None).layer(BareTool);
    let run = ToolRequest::new("search", json!({"q": "rust"})).run_id("run-42");
    let mut group = c.benchmark_group("budget_redis");
    group.bench_function("budget_admit_redis", |b| {
        b.to_async(&rt)
            .iter(|| svc.clone().oneshot(black_box(run.clone())))
    });
    group.finish();
}

criterion_group!(benches, budget_admit, budget_redis);
criterion_main!(benches);
