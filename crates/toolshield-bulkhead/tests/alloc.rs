//! The admit path (a free slot taken, the call, the slot given back) allocates nothing,
//! for one compartment and for a key already held.

use std::alloc::System;

use serde_json::json;
use toolshield_bulkhead::{BulkheadLayer, ByCaller};
use toolshield_core::ToolRequest;
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
    let mut whole = BulkheadLayer::new(10).layer(BareTool);
    let mut keyed = BulkheadLayer::new(10).keyed(ByCaller, 100).layer(BareTool);
    let req = ToolRequest::new("weather", json!({})).caller("agent-7");
    assert!(call_now(&mut whole, req.clone()).is_ok());
    assert!(call_now(&mut keyed, req.clone()).is_ok());
    let allocations = least_of(3, || {
        measure(|| {
            for _ in 0..1_000 {
                assert!(call_now(&mut whole, req.clone()).is_ok());
                assert!(call_now(&mut keyed, req.clone()).is_ok());
            }
        })
        .1
        .allocations
    });
    assert_eq!(allocations, 0);
}
