//! The timeout and cancel layers add no heap allocation per call on the success path,
//! alone, stacked, and under retry.
//!
//! One test in this file: the counting allocator sees every thread of the process.

use std::alloc::System;
use std::time::Duration;

use serde_json::json;
use toolshield_cancel::CancelLayer;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_test::alloc::{least_of, measure, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::{call_now, BareTool};
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations made by `n` calls through `svc`, requests built beforehand: the least of
/// three runs. The counter is process-wide, so another thread (the test harness printing
/// as the test starts) can add a few; a layer that allocates per call adds at least `n`
/// to every run.
fn allocations_per_call<S>(svc: &mut S, n: usize) -> usize
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    least_of(3, || allocations_once(svc, n))
}

fn allocations_once<S>(svc: &mut S, n: usize) -> usize
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    let reqs: Vec<_> = (0..n).map(|_| ToolRequest::new("t", json!(null))).collect();
    let ((), stats) = measure(|| {
        for req in reqs {
            assert!(call_now(svc, req).is_ok());
        }
    });
    stats.allocations + stats.reallocations
}

#[test]
fn timeout_deadline_and_cancel_do_not_allocate_on_success() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut timeout = TimeoutLayer::new(Duration::from_secs(30))
            .soft_threshold(Duration::from_secs(2))
            .layer(BareTool);
        let mut deadline = DeadlineLayer::new(Duration::from_secs(30)).layer(BareTool);
        let mut cancel = CancelLayer::new().layer(BareTool);
        let mut all = CancelLayer::new().layer(
            DeadlineLayer::new(Duration::from_secs(30))
                .layer(TimeoutLayer::new(Duration::from_secs(30)).layer(BareTool)),
        );
        // warm up lazily initialised runtime state (timer wheel, thread locals)
        allocations_per_call(&mut all, 10);

        assert_eq!(
            allocations_per_call(&mut BareTool, 1000),
            0,
            "the baseline must not allocate"
        );
        assert_eq!(
            allocations_per_call(&mut timeout, 1000),
            0,
            "attempt timeout allocates"
        );
        assert_eq!(
            allocations_per_call(&mut deadline, 1000),
            0,
            "deadline allocates"
        );
        assert_eq!(
            allocations_per_call(&mut cancel, 1000),
            0,
            "cancel allocates"
        );
        assert_eq!(
            allocations_per_call(&mut all, 1000),
            0,
            "the three together allocate"
        );
        // Each layer that keeps a copy of the request or its tokens (retry, cancel) makes
        // them the call's own first: a layer inside never takes a request built for its
        // call for a clone of a template, which would get tokens of its own.
        let mut retried = toolshield_retry::RetryLayer::default().layer(
            CancelLayer::new().layer(TimeoutLayer::new(Duration::from_secs(30)).layer(BareTool)),
        );
        allocations_per_call(&mut retried, 10);
        assert_eq!(
            allocations_per_call(&mut retried, 1000),
            0,
            "retry around cancel around the attempt timeout allocates"
        );
    });
}
