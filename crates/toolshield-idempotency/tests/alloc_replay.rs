//! A replay from the in-memory store allocates a small, fixed number of times: no copy of
//! the stored record, no PENDING record, no owner token, no boxed future.
//!
//! One test in this file: the counting allocator sees every thread of the process.

use std::alloc::System;

use serde_json::json;
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer};
use toolshield_test::alloc::{least_of, measure, one_at_a_time, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::{call_now, BareTool};
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The allocations the layer may add to one replay from the in-memory store: the storage
/// key and the copy of the stored response (its JSON); one to spare. A replay is answered
/// in `call`: no boxed future, no owner token, no claim.
const MAX_EXTRA_PER_REPLAY: usize = 3;

fn pay() -> ToolRequest {
    ToolRequest::new(
        "pay",
        json!({"amount": 42, "currency": "EUR", "to": "acct_123"}),
    )
    .kind(CallKind::Mutating)
    .idempotency_key("order-7")
}

/// Allocations (and reallocations) per call of `n` calls, the least of three runs: the
/// requests are built before counting, so only the service's own work is counted.
fn per_call<S>(svc: &mut S, n: usize) -> usize
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    least_of(3, || {
        let reqs: Vec<_> = (0..n).map(|_| pay()).collect();
        let ((), stats) = measure(|| {
            for req in reqs {
                let resp = call_now(svc, req).expect("the call succeeds at once");
                std::hint::black_box(resp);
            }
        });
        (stats.allocations + stats.reallocations) / n
    })
}

#[test]
fn a_replay_allocates_a_bounded_number_of_times() {
    let _one = one_at_a_time();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _in_rt = rt.enter();
    let mut svc = IdempotencyLayer::new(IdempotencyConfig::default())
        .expect("config")
        .layer(BareTool);
    let first = call_now(&mut svc, pay()).expect("first call");
    assert!(!first.provenance.replayed, "the first call runs the tool");
    let again = call_now(&mut svc, pay()).expect("replay");
    assert!(again.provenance.replayed, "the same key and payload replay");

    let bare = per_call(&mut BareTool, 200);
    let replay = per_call(&mut svc, 200);
    assert!(
        replay <= bare + MAX_EXTRA_PER_REPLAY,
        "a replay allocates {replay} times, the bare tool {bare}: more than {MAX_EXTRA_PER_REPLAY} extra"
    );
}
