//! What the fault tests share: a tool that counts its executions (and how many run at
//! once), and a layer over an in-memory store wrapped in `FaultyStore`.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::sleep;
use toolshield_core::faults::FaultPlan;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::testing::FaultyStore;
use toolshield_idempotency::{
    IdempotencyConfig, IdempotencyHandle, IdempotencyLayer, InMemoryIdempotencyStore,
};
use tower::service_fn;
use tower::util::BoxCloneService;

pub type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// Counts executions, and how many run at once (a drop of the future ends one).
#[derive(Default)]
pub struct Runs {
    pub started: AtomicUsize,
    pub running: AtomicUsize,
    pub max_running: AtomicUsize,
}

/// One execution running: counted out when dropped.
struct Running(Arc<Runs>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts one execution in: its number (from 1), and what counts it out.
fn start(runs: &Arc<Runs>) -> (usize, Running) {
    let n = runs.started.fetch_add(1, Ordering::SeqCst) + 1;
    let now = runs.running.fetch_add(1, Ordering::SeqCst) + 1;
    runs.max_running.fetch_max(now, Ordering::SeqCst);
    (n, Running(Arc::clone(runs)))
}

/// A tool that takes `delay` and answers `answer(n)` for its n-th execution.
pub fn tool<F>(runs: &Arc<Runs>, delay: Duration, answer: F) -> Svc
where
    F: Fn(usize) -> Result<ToolResponse, ToolError> + Clone + Send + Sync + 'static,
{
    let runs = Arc::clone(runs);
    BoxCloneService::new(service_fn(move |_req: ToolRequest| {
        let runs = Arc::clone(&runs);
        let answer = answer.clone();
        async move {
            let (n, _running) = start(&runs);
            sleep(delay).await;
            answer(n)
        }
    }))
}

/// [`tool`], watching its call's token: a cancelled call answers `CANCELLED`, as a
/// well-behaved tool does.
pub fn tool_watching_token<F>(runs: &Arc<Runs>, delay: Duration, answer: F) -> Svc
where
    F: Fn(usize) -> Result<ToolResponse, ToolError> + Clone + Send + Sync + 'static,
{
    let runs = Arc::clone(runs);
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let runs = Arc::clone(&runs);
        let answer = answer.clone();
        async move {
            let (n, _running) = start(&runs);
            tokio::select! {
                () = req.call_token().cancelled() => Err(ToolError::cancelled("stopped")),
                () = sleep(delay) => answer(n),
            }
        }
    }))
}

pub fn ok_n(n: usize) -> Result<ToolResponse, ToolError> {
    Ok(ToolResponse::new(json!({ "charge": n })))
}

/// A layer over an in-memory store whose operations `FaultPlan` can fail.
pub fn faulty(cfg: IdempotencyConfig) -> (IdempotencyLayer, IdempotencyHandle, FaultPlan) {
    let plan = FaultPlan::new();
    let store = FaultyStore::new(Arc::new(InMemoryIdempotencyStore::new()), plan.clone());
    let layer = IdempotencyLayer::with_store(cfg, Arc::new(store)).expect("valid config");
    let handle = layer.handle();
    (layer, handle, plan)
}
