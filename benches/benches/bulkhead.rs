//! Bulkhead, admit path (a free slot taken, the call, the slot given back): the bare
//! service, toolshield's bulkhead (one compartment, and keyed by tool name), tower's
//! `ConcurrencyLimit` and tower-resilience's bulkhead, in one group; and a keyed
//! bulkhead's rejection of a new key while all its compartments are busy.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::future::{ready, Ready};
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll};

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::Value;
use toolshield_bulkhead::{BulkheadLayer, ByName};
use toolshield_core::{ShieldRequest, ToolError, ToolResponse};
use toolshield_test::call_blocking;
use tower::{Layer, Service};

/// A request that costs nothing to clone, so the group measures the bulkheads.
#[derive(Clone)]
struct LiteRequest {
    name: Arc<str>,
}

impl ShieldRequest for LiteRequest {
    fn call_name(&self) -> Option<&str> {
        Some(&self.name)
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

fn call<S>(svc: &mut S, req: &LiteRequest)
where
    S: Service<LiteRequest>,
    S::Error: std::fmt::Debug,
{
    let res = call_blocking(svc, req.clone());
    assert!(res.is_ok());
}

fn admit(c: &mut Criterion) {
    let req = LiteRequest {
        name: Arc::from("weather"),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _enter = rt.enter();
    let mut g = c.benchmark_group("bulkhead_admit");

    let mut bare = BareTool;
    g.bench_function("bare", |b| b.iter(|| call(&mut bare, black_box(&req))));

    let mut ours = BulkheadLayer::new(10).layer(BareTool);
    g.bench_function("toolshield", |b| {
        b.iter(|| call(&mut ours, black_box(&req)))
    });

    let mut keyed = BulkheadLayer::new(10).keyed(ByName, 1_000).layer(BareTool);
    g.bench_function("toolshield_keyed", |b| {
        b.iter(|| call(&mut keyed, black_box(&req)))
    });

    let mut tower_limit = tower::limit::ConcurrencyLimitLayer::new(10).layer(BareTool);
    g.bench_function("tower_concurrency_limit", |b| {
        b.iter(|| call(&mut tower_limit, black_box(&req)))
    });

    let mut peer = tower_resilience::bulkhead::BulkheadLayer::builder()
        .max_concurrent_calls(10)
        .reject_when_full()
        .build()
        .expect("valid peer config")
        .layer(BareTool);
    g.bench_function("tower-resilience", |b| {
        b.iter(|| call(&mut peer, black_box(&req)))
    });
    g.finish();
}

/// A new key while every one of `max_keys` compartments is busy: the rejection, which a
/// flood of new keys forces on every call.
fn new_key_all_busy(c: &mut Criterion) {
    const KEYS: usize = 10_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _enter = rt.enter();
    let mut g = c.benchmark_group("bulkhead_new_key_all_busy");
    let mut keyed = BulkheadLayer::new(1).keyed(ByName, KEYS).layer(BareTool);
    // Each future holds its compartment's one slot until dropped, after the group.
    let held: Vec<_> = (0..KEYS)
        .map(|n| {
            keyed.call(LiteRequest {
                name: Arc::from(format!("busy-{n}")),
            })
        })
        .collect();
    let new = LiteRequest {
        name: Arc::from("new"),
    };
    g.bench_function("toolshield_keyed_10000_busy", |b| {
        b.iter(|| {
            let res = call_blocking(&mut keyed, black_box(&new).clone());
            assert!(res.is_err());
        })
    });
    g.finish();
    drop(held);
}

criterion_group!(benches, admit, new_key_all_busy);
criterion_main!(benches);
