//! The admit path over the in-memory store (key lookup, GCRA decision, call) allocates
//! nothing once the key is held.

use std::alloc::System;
use std::time::Duration;

use serde_json::json;
use toolshield_core::ToolRequest;
use toolshield_ratelimit::{ByCaller, RateLimit, RateLimitLayer};
use toolshield_test::alloc::{least_of, measure, one_at_a_time, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::{call_now, BareTool};
use tower::Layer;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn the_admit_path_does_not_allocate() {
    let _one_at_a_time = one_at_a_time();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let limit = RateLimit::new(1_000_000, Duration::from_secs(1), 1_000_000);
    let mut by_tool = RateLimitLayer::new(limit).layer(BareTool);
    let mut by_caller = RateLimitLayer::new(limit).keyed(ByCaller).layer(BareTool);
    let req = ToolRequest::new("weather", json!({})).caller("agent-7");
    // Warm up: the keys are created.
    assert!(call_now(&mut by_tool, req.clone()).is_ok());
    assert!(call_now(&mut by_caller, req.clone()).is_ok());
    let allocations = least_of(3, || {
        measure(|| {
            for _ in 0..1_000 {
                assert!(call_now(&mut by_tool, req.clone()).is_ok());
                assert!(call_now(&mut by_caller, req.clone()).is_ok());
            }
        })
        .1
        .allocations
    });
    assert_eq!(allocations, 0);
}
