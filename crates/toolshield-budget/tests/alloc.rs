//! Admitting a call of a known run (in memory) allocates nothing, and neither does
//! rejecting one.

use std::alloc::System;

use serde_json::json;
use toolshield_budget::{BudgetLayer, BudgetLedger};
use toolshield_core::{ErrorKind, ToolRequest};
use toolshield_test::alloc::{least_of, measure, one_at_a_time, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::{call_now, BareTool};
use tower::Layer;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn the_admit_and_reject_paths_of_a_known_run_do_not_allocate() {
    let _one_at_a_time = one_at_a_time();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let ledger = BudgetLedger::new()
        .run_max_calls(1_000_000)
        .run_max_cost(1 << 40);
    let mut search = BudgetLayer::new(&ledger, "search", Some(1_000_000))
        .cost(3)
        .layer(BareTool);
    let mut fetch = BudgetLayer::new(&ledger, "fetch", Some(5)).layer(BareTool);
    let req = ToolRequest::new("search", json!({}))
        .run_id("run-1")
        .caller("alice");
    let other = ToolRequest::new("fetch", json!({})).run_id("run-1");
    // Warm up: the run, both tools in it, the key buffer of this thread.
    for _ in 0..10 {
        call_now(&mut search, req.clone()).unwrap();
        let _ = call_now(&mut fetch, other.clone());
    }
    let admit = least_of(3, || {
        measure(|| {
            for _ in 0..100 {
                call_now(&mut search, req.clone()).unwrap();
            }
        })
        .1
        .allocations
    });
    assert_eq!(admit, 0, "admitting allocates");
    let reject = least_of(3, || {
        measure(|| {
            for _ in 0..100 {
                let e = call_now(&mut fetch, other.clone()).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
            }
        })
        .1
        .allocations
    });
    // The error message is formatted: one allocation per rejection, no more.
    assert!(reject <= 100, "{reject} allocations for 100 rejections");
}
