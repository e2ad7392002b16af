//! No allocation per call on the success path of the attempt timeout and the call
//! deadline: the timer is armed only when the tool returns `Pending`, the attempt guard
//! is a clone of the request's tokens. This file holds a single test: the counting
//! allocator sees every thread.

use std::alloc::System;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde_json::json;
use toolshield_core::{CallKind, ToolRequest};
use toolshield_test::alloc::{least_of, measure, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::BareTool;
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CALLS: usize = 1000;

/// Allocations (and reallocations) made by `CALLS` successful calls of `svc`, each
/// finishing on its first poll; the least of three runs (another thread can add a few to
/// one run, an allocation per call adds `CALLS` to every run).
fn allocations_per_run<S>(mut svc: S) -> usize
where
    S: Service<ToolRequest>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    least_of(3, || {
        // Requests are built outside the measured region (building one allocates).
        let requests: Vec<ToolRequest> = (0..CALLS)
            .map(|_| ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly))
            .collect();
        let (ok, stats) = measure(|| {
            let mut ok = 0;
            for req in requests {
                assert!(svc.poll_ready(&mut cx).is_ready());
                let fut = pin!(svc.call(req));
                if let Poll::Ready(Ok(_)) = fut.poll(&mut cx) {
                    ok += 1;
                }
            }
            ok
        });
        assert_eq!(ok, CALLS, "every call succeeds on its first poll");
        stats.allocations + stats.reallocations
    })
}

#[test]
fn the_success_path_allocates_nothing_per_call() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _entered = rt.enter();

    let attempt = TimeoutLayer::new(Duration::from_secs(30)).layer(BareTool);
    assert_eq!(allocations_per_run(attempt), 0, "attempt timeout");

    let soft = TimeoutLayer::new(Duration::from_secs(30))
        .soft_threshold(Duration::from_secs(2))
        .layer(BareTool);
    assert_eq!(
        allocations_per_run(soft),
        0,
        "attempt timeout with a soft threshold"
    );

    let both = DeadlineLayer::new(Duration::from_secs(60))
        .layer(TimeoutLayer::new(Duration::from_secs(30)).layer(BareTool));
    assert_eq!(
        allocations_per_run(both),
        0,
        "call deadline over attempt timeout"
    );
}
