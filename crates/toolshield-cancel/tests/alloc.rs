//! The cancel layer allocates nothing per call on its success path: for a tool that
//! answers at once and for one that is pending first (the layer then waits on the token
//! too). This file holds a single test: the counting allocator sees every thread.

use std::alloc::System;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolshield_cancel::CancelLayer;
use toolshield_core::ToolRequest;
use toolshield_test::alloc::{allocations_of_calls, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::{BareTool, PendingOnceTool};
use tower::Layer;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CALLS: usize = 1000;

#[test]
fn the_success_path_allocates_nothing_per_call() {
    // The caller's own token, as a caller that can cancel passes one.
    let token = CancellationToken::new();
    let request =
        || ToolRequest::new("weather", json!({"city": "Paris"})).cancel_token(token.clone());
    let at_once = allocations_of_calls(&mut CancelLayer::new().layer(BareTool), CALLS, request);
    let pending = allocations_of_calls(
        &mut CancelLayer::new().layer(PendingOnceTool),
        CALLS,
        request,
    );
    assert_eq!(at_once, 0, "a tool that answers at once");
    assert_eq!(pending, 0, "a tool that is pending first");
    assert!(!token.is_cancelled());
}
