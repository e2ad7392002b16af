//! A hedge that loses gives back what it held inside: its bulkhead slot (the future is
//! dropped), and its attempt token is cancelled; the winner's is not. Paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_bulkhead::BulkheadLayer;
use toolshield_contract::{CallKind, ShieldRequest, ToolError};
use toolshield_core::{ToolRequest, ToolResponse};
use toolshield_hedge::{HedgeDelay, HedgeLayer};
use tower::{service_fn, Layer, ServiceExt};

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn losing_attempts_give_their_bulkhead_slots_back() {
    let calls = Arc::new(AtomicUsize::new(0));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let (c, x, tk) = (
        Arc::clone(&calls),
        Arc::clone(&cancelled),
        Arc::clone(&tokens),
    );
    // The first two attempts hang; the third answers at once.
    let tool = service_fn(move |req: ToolRequest| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        let x = Arc::clone(&x);
        let token = req.call_state().map(|s| s.tokens().attempt().clone());
        tk.lock().unwrap().extend(token.clone());
        async move {
            if n < 2 {
                if let Some(t) = token {
                    t.cancelled().await;
                    x.fetch_add(1, Ordering::SeqCst);
                }
                return Err(ToolError::cancelled("lost"));
            }
            Ok::<_, ToolError>(ToolResponse::new(json!(n)))
        }
    });
    let bulkhead = BulkheadLayer::new(3);
    let stats = bulkhead.stats();
    let hedge = HedgeLayer::new(HedgeDelay::fixed(Duration::from_millis(100)), 2);
    let svc = hedge.layer(bulkhead.layer(tool));
    let req = ToolRequest::new("search", json!({})).kind(CallKind::ReadOnly);
    let call = tokio::spawn(svc.clone().oneshot(req));
    settle().await;
    advance(Duration::from_millis(100)).await;
    settle().await;
    assert_eq!(stats.snapshot().in_flight, 2);
    advance(Duration::from_millis(100)).await;
    settle().await;
    let res = call.await.unwrap().unwrap();
    assert_eq!(res.output, json!(2));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let s = stats.snapshot();
    assert_eq!((s.in_flight, s.admitted, s.rejected), (0, 3, 0), "{s:?}");
    // The losers' futures were dropped: they never saw their cancelled token resolve.
    settle().await;
    assert_eq!(cancelled.load(Ordering::SeqCst), 0);
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), 3);
    assert!(
        tokens[0].is_cancelled() && tokens[1].is_cancelled(),
        "losers cancelled"
    );
    assert!(
        !tokens[2].is_cancelled(),
        "the winner's token is left alone"
    );
}
