//! The closed-state path (lookup, admit, call, record) allocates nothing, with the last
//! key cached, with keys alternating, and with failures in the window.

use std::alloc::System;
use std::future::{ready, Ready};
use std::task::{Context, Poll};

use serde_json::{json, Value};
use toolshield_breaker::{BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_test::alloc::{
    least_of, measure, one_at_a_time, Region, StatsAlloc, INSTRUMENTED_SYSTEM,
};
use toolshield_test::call_now;
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(Clone)]
struct Ready2;

impl Service<ToolRequest> for Ready2 {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        if req.payload().get("fail").is_some() {
            ready(Err(ToolError::execution_failed("boom")))
        } else {
            ready(Ok(ToolResponse::new(Value::Bool(true))))
        }
    }
}

fn run<S>(svc: &mut S, req: &ToolRequest) -> bool
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    call_now(svc, req.clone()).is_ok()
}

#[test]
fn the_closed_path_does_not_allocate() {
    // The allocator counts every thread: the tests of this file measure one at a time.
    let _one_at_a_time = one_at_a_time();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let registry = BreakerRegistry::default();
    let mut svc = BreakerLayer::new(registry.clone()).layer(Ready2);
    let a = ToolRequest::new("weather", json!({}));
    let b = ToolRequest::new("search", json!({}));
    let fail = ToolRequest::new("weather", json!({"fail": true}));
    // Warm up: create both breakers and fill the window.
    for _ in 0..200 {
        run(&mut svc, &a);
        run(&mut svc, &b);
    }

    // The counter is process-wide: another thread (the test harness printing as the test
    // starts) can add a few allocations to one run, while an allocation per call adds one
    // per call to every run. So the cached-key case takes the least of three runs.
    let cached = (0..3)
        .map(|_| {
            let region = Region::new(GLOBAL);
            for _ in 0..10_000 {
                assert!(run(&mut svc, &a));
            }
            region.change()
        })
        .min_by_key(|s| s.allocations)
        .expect("three runs");

    let region = Region::new(GLOBAL);
    for _ in 0..1_000 {
        assert!(run(&mut svc, &a));
        assert!(run(&mut svc, &b));
    }
    let alternating = region.change();

    let region = Region::new(GLOBAL);
    for i in 0..1_000 {
        if i % 10 == 0 {
            assert!(!run(&mut svc, &fail));
        } else {
            assert!(run(&mut svc, &a));
        }
    }
    let with_failures = region.change();

    assert_eq!(registry.state("weather"), CircuitState::Closed);
    assert_eq!(registry.status("weather").unwrap().failures_in_window, 10);
    assert_eq!(cached.allocations, 0, "cached key: {cached:?}");
    assert_eq!(
        alternating.allocations, 0,
        "alternating keys: {alternating:?}"
    );
    assert_eq!(
        with_failures.allocations, 0,
        "failures in the window: {with_failures:?}"
    );

    // A service of a pinned key, its calls holding the breaker through the service's
    // slot: nothing allocated per call either (the slot is made when the service is).
    let mut pinned = BreakerLayer::new(registry.clone())
        .pin_key("weather")
        .layer(Ready2);
    for _ in 0..200 {
        run(&mut pinned, &a);
    }
    let pinned_allocations = least_of(3, || {
        measure(|| {
            for _ in 0..10_000 {
                assert!(run(&mut pinned, &a));
            }
        })
        .1
        .allocations
    });
    assert_eq!(pinned_allocations, 0, "pinned key");
}

#[test]
fn a_new_key_on_a_full_registry_does_not_allocate() {
    // The allocator counts every thread: the tests of this file measure one at a time.
    let _one_at_a_time = one_at_a_time();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let registry = BreakerRegistry::new(toolshield_breaker::BreakerConfig {
        max_keys: 10,
        ..Default::default()
    })
    .unwrap();
    // Full of breakers that cannot be evicted (forced open).
    for i in 0..10 {
        registry.force_open(&format!("held-{i}"));
    }
    let mut svc = BreakerLayer::new(registry.clone()).layer(Ready2);
    // Requests built beforehand: their own allocations are not the layer's.
    let reqs: Vec<ToolRequest> = (0..1_000)
        .map(|i| ToolRequest::new(format!("new-{i}"), json!({})))
        .collect();
    assert!(
        run(&mut svc, &reqs[0]),
        "warm up: the overflow breaker exists"
    );
    let runs = (0..3)
        .map(|_| {
            let region = Region::new(GLOBAL);
            for req in &reqs[1..] {
                assert!(run(&mut svc, req), "an overflowed call is admitted");
            }
            region.change()
        })
        .min_by_key(|s| s.allocations)
        .expect("three runs");
    assert_eq!(registry.len(), 10, "nothing was kept");
    assert!(registry.overflowed() >= 999);
    assert_eq!(runs.allocations, 0, "new keys on a full registry: {runs:?}");
}
