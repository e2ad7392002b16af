//! A call answered before the hedge delay allocates nothing, with a fixed delay and with a
//! percentile delay (its histogram records the latency), and neither does a call that is
//! never hedged.

use std::alloc::System;
use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::{json, Value};
use toolshield_contract::CallKind;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use toolshield_retry::RetryBudget;
use toolshield_test::alloc::{least_of, one_at_a_time, Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::call_now;
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(Clone, Copy)]
struct Instant;

impl Service<ToolRequest> for Instant {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        ready(Ok(ToolResponse::new(Value::Bool(true))))
    }
}

/// Allocations per 1,000 calls, each with a request from `request`, made before the
/// measured part (a request built for its call, as an agent framework builds one).
fn allocations<S>(svc: &mut S, request: impl Fn() -> ToolRequest) -> u64
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    for _ in 0..100 {
        assert!(call_now(svc, request()).is_ok());
    }
    least_of(3, || {
        let requests: Vec<ToolRequest> = (0..1_000).map(|_| request()).collect();
        let region = Region::new(GLOBAL);
        for req in requests {
            assert!(call_now(svc, req).is_ok());
        }
        region.change().allocations as u64
    })
}

#[test]
fn a_call_answered_before_the_delay_allocates_nothing() {
    let _one_at_a_time = one_at_a_time();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let read = || ToolRequest::new("weather", json!({"city": "Oslo"})).kind(CallKind::ReadOnly);

    let mut fixed = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(50)), 2)
        .with_budget(Arc::new(RetryBudget::new(0.2, 10, 100)))
        .layer(Instant);
    assert_eq!(allocations(&mut fixed, read), 0, "fixed delay");
    // A clone of a template sent as a call gets an attempt token of its own (the
    // template's is shared with every other clone): one allocation, nothing more.
    let template = read();
    assert_eq!(
        allocations(&mut fixed, || template.clone()),
        1_000,
        "fixed delay, clones of one template"
    );

    let pct = HedgeLayer::new(
        HedgeDelay::percentile(95.0, Duration::from_millis(1), Duration::from_secs(1)),
        2,
    );
    let mut svc = pct.layer(Instant);
    assert_eq!(allocations(&mut svc, read), 0, "percentile delay");
    assert!(
        !pct.delay().histogram().unwrap().is_empty(),
        "latencies were recorded"
    );

    let pay = || ToolRequest::new("pay", json!({"amount": 1})).kind(CallKind::Mutating);
    assert_eq!(allocations(&mut fixed, pay), 0, "never hedged");
}
