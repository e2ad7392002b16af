//! Per-call overhead of the timeout, deadline and cancel layers over the bare service,
//! and of tower's own timeout as the peer, in one group per kind of request:
//!
//! - `timeout_cancel_success`: every call sends a clone of one template request. The
//!   first layer gives a clone its own attempt token (a clone still held by another copy
//!   shares the template's), so the layers that own the call (the timeout, the deadline)
//!   pay one allocation and a lock here;
//! - `timeout_cancel_success_fresh_request`: every call sends a request built for it (as
//!   an agent framework builds one per tool call), made outside the timed part; nothing
//!   is shared, nothing is paid.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion};
use serde_json::Value;
use tokio::runtime::Runtime;
use toolshield_benches::BareTool;
use toolshield_cancel::CancelLayer;
use toolshield_core::ToolRequest;
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::{Layer, Service};

/// Calls `svc` once with `req`.
async fn call_once<S>(svc: &mut S, req: ToolRequest)
where
    S: Service<ToolRequest>,
    S::Error: std::fmt::Debug,
{
    assert!(toolshield_test::call(svc, req).await.is_ok());
}

/// One entry: `svc` cloned for each call, called with a clone of `template` or, when
/// `fresh`, with a request built for the call outside the timed part.
fn entry<S>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    svc: &S,
    template: &ToolRequest,
    fresh: bool,
) where
    S: Service<ToolRequest> + Clone,
    S::Error: std::fmt::Debug,
{
    group.bench_function(name, |b| {
        if fresh {
            b.to_async(rt).iter_batched(
                || ToolRequest::new("bench", Value::Null),
                |req| {
                    let mut s = svc.clone();
                    async move { call_once(&mut s, req).await }
                },
                BatchSize::SmallInput,
            );
        } else {
            b.to_async(rt).iter(|| {
                let mut s = svc.clone();
                let req = template.clone();
                async move { call_once(&mut s, req).await }
            });
        }
    });
}

fn layers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let template = ToolRequest::new("bench", Value::Null);
    let timeout = TimeoutLayer::new(Duration::from_secs(30)).layer(BareTool);
    let timeout_soft = TimeoutLayer::new(Duration::from_secs(30))
        .soft_threshold(Duration::from_secs(2))
        .layer(BareTool);
    let deadline = DeadlineLayer::new(Duration::from_secs(30)).layer(BareTool);
    let cancel = CancelLayer::new().layer(BareTool);
    let tower_timeout = tower::timeout::TimeoutLayer::new(Duration::from_secs(30)).layer(BareTool);

    for (group_name, fresh) in [
        ("timeout_cancel_success", false),
        ("timeout_cancel_success_fresh_request", true),
    ] {
        let mut group = c.benchmark_group(group_name);
        let (g, t) = (&mut group, &template);
        entry(g, &rt, "bare", &BareTool, t, fresh);
        entry(g, &rt, "toolshield_timeout", &timeout, t, fresh);
        entry(g, &rt, "toolshield_timeout_soft", &timeout_soft, t, fresh);
        entry(g, &rt, "toolshield_deadline", &deadline, t, fresh);
        entry(g, &rt, "toolshield_cancel", &cancel, t, fresh);
        entry(g, &rt, "tower_timeout", &tower_timeout, t, fresh);
        group.finish();
    }
}

criterion_group!(benches, layers);
criterion_main!(benches);
