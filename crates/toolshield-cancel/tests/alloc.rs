//! No allocation per call on the success path of the cancellation layer: the token check
//! before the call and the race against it allocate nothing when the tool finishes on its
//! first poll. This file holds a single test: the counting allocator sees every thread.

use std::alloc::System;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use serde_json::json;
use toolshield_cancel::CancelLayer;
use toolshield_core::{CallKind, ToolRequest};
use toolshield_test::alloc::{least_of, measure, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::BareTool;
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn the_success_path_allocates_nothing_per_call() {
    const CALLS: usize = 1000;
    let mut svc = CancelLayer::new().layer(BareTool);
    let mut cx = Context::from_waker(Waker::noop());
    // The least of three runs: another thread can add a few allocations to one run, an
    // allocation per call adds `CALLS` to every run.
    let allocations = least_of(3, || {
        // Requests are built outside the measured region (building one allocates).
        let requests: Vec<ToolRequest> = (0..CALLS)
            .map(|_| ToolRequest::new("pay", json!({"amount": 5})).kind(CallKind::Mutating))
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
    });
    assert_eq!(allocations, 0);
}
