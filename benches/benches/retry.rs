//! Retry, first attempt succeeds: the bare service, toolshield's retry layer and
//! `tower::retry::Retry` with a comparable policy (3 attempts, retriable errors only,
//! request cloned up front) in one group. Both retry layers clone the inner service per
//! call, and cloning `BareTool` allocates (its output is a JSON object), so a second group
//! repeats the comparison around a tool whose clone is free, to show the layers' own cost.
//!
//! Those groups send a clone of one template request per call, which the retry layer,
//! the first to see the call, gives tokens of its own (one allocation; see
//! docs/semantics.md, "Clones of one request are separate calls"). A third group sends a
//! request built for each call (made outside the timed part, as an agent framework
//! builds one per tool call), which shares nothing and pays nothing.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::future::{ready, Ready};
use std::hint::black_box;
use std::task::{Context, Poll};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use toolshield_benches::{payload_200b, BareTool};
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use toolshield_retry::RetryLayer;
use toolshield_test::call_blocking;
use tower::retry::{Policy, RetryLayer as TowerRetryLayer};
use tower::{Layer, Service};

/// One call through `svc` with `req` (readiness, call, await), asserting success.
fn call<S>(svc: &mut S, req: ToolRequest)
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: std::fmt::Debug,
{
    let res = call_blocking(svc, req);
    assert!(black_box(res).is_ok());
}

/// tower's retry with the same decisions as toolshield's defaults, minus the backoff
/// (never reached here): at most 3 attempts, retriable kinds only.
#[derive(Clone)]
struct ThreeAttempts(u32);

impl Policy<ToolRequest, ToolResponse, ToolError> for ThreeAttempts {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _req: &mut ToolRequest,
        result: &mut Result<ToolResponse, ToolError>,
    ) -> Option<Self::Future> {
        match result {
            Err(e) if e.is_retriable() && self.0 < 3 => {
                self.0 += 1;
                Some(ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &ToolRequest) -> Option<ToolRequest> {
        Some(req.clone())
    }
}

/// A tool whose clone costs nothing (a unit struct), answering like `BareTool`.
#[derive(Clone, Copy)]
struct UnitTool;

impl Service<ToolRequest> for UnitTool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        ready(Ok(ToolResponse::new(serde_json::Value::Bool(true))))
    }
}

fn retry_first_attempt_success_unit_tool(c: &mut Criterion) {
    let req = ToolRequest::new("weather", payload_200b()).kind(CallKind::ReadOnly);
    let mut group = c.benchmark_group("retry_first_attempt_success_unit_tool");

    let mut bare = UnitTool;
    group.bench_function("bare", |b| b.iter(|| call(&mut bare, req.clone())));

    // What the retry layers add on top of `call` for a retriable request: one more clone
    // (and drop) of the request.
    group.bench_function("request_clone_only", |b| {
        b.iter(|| drop(black_box(req.clone())))
    });

    let mut shield = RetryLayer::default().layer(UnitTool);
    group.bench_function("toolshield_retry", |b| {
        b.iter(|| call(&mut shield, req.clone()))
    });

    let mut shield_no_budget = RetryLayer::default().without_budget().layer(UnitTool);
    group.bench_function("toolshield_retry_no_budget", |b| {
        b.iter(|| call(&mut shield_no_budget, req.clone()))
    });

    let mutating = ToolRequest::new("pay", payload_200b()).kind(CallKind::Mutating);
    let mut shield_mutating = RetryLayer::default().layer(UnitTool);
    group.bench_function("toolshield_retry_mutating_no_key", |b| {
        b.iter(|| call(&mut shield_mutating, mutating.clone()))
    });

    let mut tower_retry = TowerRetryLayer::new(ThreeAttempts(1)).layer(UnitTool);
    group.bench_function("tower_retry", |b| {
        b.iter(|| call(&mut tower_retry, req.clone()))
    });

    group.finish();
}

fn retry_first_attempt_success(c: &mut Criterion) {
    let req = ToolRequest::new("weather", payload_200b()).kind(CallKind::ReadOnly);
    let mut group = c.benchmark_group("retry_first_attempt_success");

    let mut bare = BareTool::new();
    group.bench_function("bare", |b| b.iter(|| call(&mut bare, req.clone())));

    let mut shield = RetryLayer::default().layer(BareTool::new());
    group.bench_function("toolshield_retry", |b| {
        b.iter(|| call(&mut shield, req.clone()))
    });

    let mut shield_no_budget = RetryLayer::default()
        .without_budget()
        .layer(BareTool::new());
    group.bench_function("toolshield_retry_no_budget", |b| {
        b.iter(|| call(&mut shield_no_budget, req.clone()))
    });

    let mut tower_retry = TowerRetryLayer::new(ThreeAttempts(1)).layer(BareTool::new());
    group.bench_function("tower_retry", |b| {
        b.iter(|| call(&mut tower_retry, req.clone()))
    });

    group.finish();
}

fn retry_first_attempt_success_unit_tool_fresh_request(c: &mut Criterion) {
    let fresh = || ToolRequest::new("weather", serde_json::Value::Null).kind(CallKind::ReadOnly);
    let mut group = c.benchmark_group("retry_first_attempt_success_unit_tool_fresh_request");
    let mut run = |name: &str, svc: &mut dyn FnMut(ToolRequest)| {
        group.bench_function(name, |b| {
            b.iter_batched(fresh, &mut *svc, BatchSize::SmallInput)
        });
    };
    let mut bare = UnitTool;
    run("bare", &mut |req| call(&mut bare, req));
    let mut shield = RetryLayer::default().layer(UnitTool);
    run("toolshield_retry", &mut |req| call(&mut shield, req));
    let mut tower_retry = TowerRetryLayer::new(ThreeAttempts(1)).layer(UnitTool);
    run("tower_retry", &mut |req| call(&mut tower_retry, req));
    group.finish();
}

criterion_group!(
    benches,
    retry_first_attempt_success,
    retry_first_attempt_success_unit_tool,
    retry_first_attempt_success_unit_tool_fresh_request
);
criterion_main!(benches);
