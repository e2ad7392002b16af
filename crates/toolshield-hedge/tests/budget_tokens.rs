//! A budget token pays for a hedge that was sent, never for one that could not be sent.
//!
//! A hedge withdraws from a budget it may share with the retry layer. A hedge that waits
//! for the inner service to become ready (a concurrency limit inside) and is then
//! overtaken by the first attempt's answer never runs: taking its token anyway would let
//! a saturated service drain the retry budget with hedges that never happened.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use toolshield_contract::CallKind;
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeBudget, HedgeDelay, HedgeLayer};
use tower::{Layer, Service, ServiceExt};

/// A budget of whole tokens, counting what was withdrawn.
#[derive(Default)]
struct Tokens {
    left: AtomicU64,
}

impl HedgeBudget for Tokens {
    fn try_withdraw(&self) -> bool {
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// A tool ready for its first call only (a concurrency limit of one, held by the first
/// attempt): every later `poll_ready` is pending. Its single call answers after 300 ms.
#[derive(Clone)]
struct ReadyOnce {
    calls: Arc<AtomicUsize>,
}

impl Service<ToolRequest> for ReadyOnce {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        if self.calls.load(Ordering::SeqCst) == 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(ToolResponse::new(json!("first")))
        })
    }
}

fn read() -> ToolRequest {
    ToolRequest::new("search".to_owned(), json!({"q": 1})).kind(CallKind::ReadOnly)
}

#[tokio::test(start_paused = true)]
async fn a_budget_token_is_spent_only_by_a_hedge_that_was_sent() {
    let budget = Arc::new(Tokens {
        left: AtomicU64::new(1),
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 2)
        .with_budget(budget.clone());
    let res = layer
        .layer(ReadyOnce {
            calls: Arc::clone(&calls),
        })
        .oneshot(read())
        .await
        .expect("the first attempt answers");
    assert_eq!(res.output, json!("first"));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no hedge could be sent");
    assert_eq!(layer.stats().hedges_sent(), 0);
    assert_eq!(
        budget.left.load(Ordering::SeqCst),
        1,
        "the token of a hedge that never ran stays in the budget"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_keeps_the_token_of_a_hedge_waiting_for_readiness() {
    let budget = Arc::new(Tokens {
        left: AtomicU64::new(1),
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 2)
        .with_budget(budget.clone());
    let mut svc = layer.layer(ReadyOnce {
        calls: Arc::clone(&calls),
    });
    let fut = svc.ready().await.unwrap().call(read());
    // Dropped at 150 ms: the hedge is due, its service not ready.
    let out = tokio::time::timeout(Duration::from_millis(150), fut).await;
    assert!(out.is_err(), "the call was cut while the hedge waited");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(budget.left.load(Ordering::SeqCst), 1);
}

/// A tool whose every clone holds `marker`: the clones alive are counted by it.
#[derive(Clone)]
struct Marked {
    _marker: Arc<()>,
}

impl Service<ToolRequest> for Marked {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(ToolResponse::new(json!("first")))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_service_made_ready_for_a_hedge_the_budget_refuses_is_dropped_at_once() {
    let budget = Arc::new(Tokens::default());
    let marker = Arc::new(());
    let layer =
        HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 2).with_budget(budget);
    let mut svc = layer.layer(Marked {
        _marker: Arc::clone(&marker),
    });
    let fut = svc.ready().await.unwrap().call(read());
    let call = tokio::spawn(fut);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = Arc::strong_count(&marker);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(layer.stats().budget_denied(), 1);
    assert_eq!(
        Arc::strong_count(&marker),
        before - 1,
        "the service held for hedges is released when hedging stops"
    );
    let res = call.await.unwrap().unwrap();
    assert_eq!(res.output, json!("first"));
}
