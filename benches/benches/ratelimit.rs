//! Rate limiter, admit path (a key's bucket checked and moved, the call): the bare
//! service, toolshield's limiter over its in-memory store (keyed by tool name), tower's
//! `RateLimit` and tower-resilience's rate limiter, each with a rate so high that no
//! call ever waits, in one group.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::future::{ready, Ready};
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::Value;
use toolshield_core::{ShieldRequest, ToolError, ToolResponse};
use toolshield_ratelimit::{ByCaller, RateLimit, RateLimitLayer};
use toolshield_test::call_blocking;
use tower::{Layer, Service};

/// A request that costs nothing to clone, so the group measures the limiters.
#[derive(Clone)]
struct LiteRequest {
    name: Arc<str>,
}

impl ShieldRequest for LiteRequest {
    fn call_name(&self) -> Option<&str> {
        Some(&self.name)
    }
    fn call_meta(&self) -> toolshield_core::CallMeta<'_> {
        toolshield_core::CallMeta::new(Some(&self.name), None, None)
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
    let mut g = c.benchmark_group("ratelimit_admit");

    let mut bare = BareTool;
    g.bench_function("bare", |b| b.iter(|| call(&mut bare, black_box(&req))));

    // One call per nanosecond with a second of burst: never limited.
    let limit = RateLimit::new(1_000_000_000, Duration::from_secs(1), 1_000_000_000);
    let mut ours = RateLimitLayer::new(limit).layer(BareTool);
    g.bench_function("toolshield", |b| {
        b.iter(|| call(&mut ours, black_box(&req)))
    });

    let mut by_caller = RateLimitLayer::new(limit).keyed(ByCaller).layer(BareTool);
    g.bench_function("toolshield_by_caller", |b| {
        b.iter(|| call(&mut by_caller, black_box(&req)))
    });

    let mut tower_rate =
        tower::limit::RateLimitLayer::new(u64::MAX / 2, Duration::from_secs(1)).layer(BareTool);
    g.bench_function("tower_rate_limit", |b| {
        b.iter(|| call(&mut tower_rate, black_box(&req)))
    });

    let mut peer = tower_resilience::ratelimiter::RateLimiterLayer::builder()
        .limit_for_period(usize::MAX / 2)
        .refresh_period(Duration::from_secs(1))
        .timeout_duration(Duration::ZERO)
        .build()
        .expect("valid peer config")
        .layer(BareTool);
    g.bench_function("tower-resilience", |b| {
        b.iter(|| call(&mut peer, black_box(&req)))
    });
    g.finish();
}

criterion_group!(benches, admit);
criterion_main!(benches);
