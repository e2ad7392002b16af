//! The attempt timeout allocates nothing per call on its success path: for a tool that
//! answers at once (no timer armed) and for one that is pending first (the timer armed
//! and dropped), with and without a soft threshold. This file holds a single test: the
//! counting allocator sees every thread.

use std::alloc::System;
use std::time::Duration;

use serde_json::json;
use toolshield_core::ToolRequest;
use toolshield_test::alloc::{allocations_of_calls, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::{BareTool, PendingOnceTool};
use toolshield_timeout::TimeoutLayer;
use tower::Layer;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CALLS: usize = 1000;

fn request() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"}))
}

#[test]
fn the_success_path_allocates_nothing_per_call() {
    // The timer needs a runtime with time: the calls are polled by hand in its context.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let plain = TimeoutLayer::new(Duration::from_secs(30));
    let soft = TimeoutLayer::new(Duration::from_secs(30)).soft_threshold(Duration::from_secs(2));
    for (name, layer) in [("no soft threshold", plain), ("soft threshold", soft)] {
        // Warm up: the timer wheel sets itself up on its first use.
        allocations_of_calls(&mut layer.layer(PendingOnceTool), CALLS, request);
        let at_once = allocations_of_calls(&mut layer.layer(BareTool), CALLS, request);
        let pending = allocations_of_calls(&mut layer.layer(PendingOnceTool), CALLS, request);
        assert_eq!(at_once, 0, "{name}, a tool that answers at once");
        assert_eq!(pending, 0, "{name}, a tool that is pending first");
    }
}
