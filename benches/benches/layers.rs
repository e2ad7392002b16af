//! Per-call overhead of the timeout, deadline and cancel layers over the bare service,
//! and of tower's own timeout as the peer, in one group.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::Value;
use toolshield_benches::BareTool;
use toolshield_cancel::CancelLayer;
use toolshield_core::ToolRequest;
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::{Layer, Service};

/// Calls `svc` once with a request cloned from `req` (a clone is a few refcount bumps,
/// the same for every entry of the group).
async fn call_once<S>(svc: &mut S, req: &ToolRequest)
where
    S: Service<ToolRequest>,
    S::Error: std::fmt::Debug,
{
    assert!(toolshield_test::call(svc, req.clone()).await.is_ok());
}

fn layers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let req = ToolRequest::new("bench", Value::Null);
    let mut group = c.benchmark_group("timeout_cancel_success");

    group.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| {
            let mut s = BareTool;
            let req = &req;
            async move { call_once(&mut s, req).await }
        })
    });

    let timeout = TimeoutLayer::new(Duration::from_secs(30)).layer(BareTool);
    group.bench_function("toolshield_timeout", |b| {
        b.to_async(&rt).iter(|| {
            let mut s = timeout.clone();
            let req = &req;
            async move { call_once(&mut s, req).await }
        })
    });

    let timeout_soft = TimeoutLayer::new(Duration::from_secs(30))
        .soft_threshold(Duration::from_secs(2))
        .layer(BareTool);
    group.bench_function("toolshield_timeout_soft", |b| {
        b.to_async(&rt).iter(|| {
            let mut s = timeout_soft.clone();
            let req = &req;
            async move { call_once(&mut s, req).await }
        })
    });

    let deadline = DeadlineLayer::new(Duration::from_secs(30)).layer(BareTool);
    group.bench_function("toolshield_deadline", |b| {
        b.to_async(&rt).iter(|| {
            let mut s = deadline.clone();
            let req = &req;
            async move { call_once(&mut s, req).await }
        })
    });

    let cancel = CancelLayer::new().layer(BareTool);
    group.bench_function("toolshield_cancel", |b| {
        b.to_async(&rt).iter(|| {
            let mut s = cancel.clone();
            let req = &req;
            async move { call_once(&mut s, req).await }
        })
    });

    let tower_timeout = tower::timeout::TimeoutLayer::new(Duration::from_secs(30)).layer(BareTool);
    group.bench_function("tower_timeout", |b| {
        b.to_async(&rt).iter(|| {
            let mut s = tower_timeout.clone();
            let req = &req;
            async move { call_once(&mut s, req).await }
        })
    });
    group.finish();
}

criterion_group!(benches, layers);
criterion_main!(benches);
