//! Hedging, the first attempt answers before the delay (no hedge sent): the bare service,
//! toolshield's hedge layer (fixed delay with a shared retry budget, and percentile
//! delay) and tower-resilience's hedge (same delay, one hedge at most) in one group. A
//! read-only request, so both layers are on their hedging path (request cloned, timer
//! armed if the first attempt were pending); the mutating entry shows the pass-through.
//!
//! Allocations per call are printed once per entry (the counting allocator of
//! `toolshield-test` is this binary's global allocator; it costs every entry the same).

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use toolshield_benches::{payload_200b, BareTool};
use toolshield_core::{CallKind, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_retry::RetryBudget;
use toolshield_test::alloc::{least_of, measure, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::call_blocking;
use tower::{Layer, Service};
use tower_resilience::hedge::HedgeLayer as TrHedgeLayer;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// One call through `svc` (readiness, call, await), asserting success.
fn call<S>(svc: &mut S, req: &ToolRequest)
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: std::fmt::Debug,
{
    let res = call_blocking(svc, req.clone());
    assert!(black_box(res).is_ok());
}

/// Allocations of one call, the least of a few runs of 1,000.
fn allocations_per_call<S>(name: &str, svc: &mut S, req: &ToolRequest)
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: std::fmt::Debug,
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
    println!("allocations per call, {name}: {}", n as f64 / 1_000.0);
}

fn hedge_primary_answers_first(c: &mut Criterion) {
    // tower-resilience arms a tokio timer per call; toolshield's needs a runtime only
    // when the first attempt is pending. Both run inside the same runtime context.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let delay = Duration::from_millis(100);
    let req = ToolRequest::new("weather", payload_200b()).kind(CallKind::ReadOnly);
    let pay = ToolRequest::new("pay", payload_200b()).kind(CallKind::Mutating);
    let mut group = c.benchmark_group("hedge_primary_answers_first");

    let mut bare = BareTool::new();
    allocations_per_call("bare", &mut bare, &req);
    group.bench_function("bare", |b| b.iter(|| call(&mut bare, &req)));

    let mut fixed = HedgeLayer::new(HedgeDelay::fixed(delay), 1)
        .with_budget(Arc::new(RetryBudget::new(0.2, 10, 100)))
        .layer(BareTool::new());
    allocations_per_call("toolshield_hedge_fixed", &mut fixed, &req);
    group.bench_function("toolshield_hedge_fixed", |b| {
        b.iter(|| call(&mut fixed, &req))
    });

    let mut pct = HedgeLayer::new(
        HedgeDelay::percentile(95.0, Duration::from_millis(10), Duration::from_secs(1)),
        1,
    )
    .layer(BareTool::new());
    allocations_per_call("toolshield_hedge_percentile", &mut pct, &req);
    group.bench_function("toolshield_hedge_percentile", |b| {
        b.iter(|| call(&mut pct, &req))
    });

    let mut passthrough = HedgeLayer::new(HedgeDelay::fixed(delay), 1).layer(BareTool::new());
    allocations_per_call("toolshield_hedge_mutating", &mut passthrough, &pay);
    group.bench_function("toolshield_hedge_mutating", |b| {
        b.iter(|| call(&mut passthrough, &pay))
    });

    let mut tr = TrHedgeLayer::builder()
        .delay(delay)
        .max_hedged_attempts(2)
        .build()
        .layer(BareTool::new());
    allocations_per_call("tower_resilience_hedge", &mut tr, &req);
    group.bench_function("tower_resilience_hedge", |b| b.iter(|| call(&mut tr, &req)));

    group.finish();
}

criterion_group!(benches, hedge_primary_answers_first);
criterion_main!(benches);
