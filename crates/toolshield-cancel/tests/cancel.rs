//! Behaviour of the cancellation layer.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolshield_cancel::CancelLayer;
use toolshield_core::{
    Classify, DefaultClassifier, ErrorKind, Outcome, ToolError, ToolRequest, ToolResponse,
};
use tower::{service_fn, Layer, Service, ServiceExt};

struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_cancelled_before_the_call_never_reaches_the_tool() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let tool = service_fn(move |_req: ToolRequest| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, ToolError>(ToolResponse::new(json!("ran"))) }
    });
    let mut svc = CancelLayer::new().layer(tool);

    let token = CancellationToken::new();
    token.cancel();
    let req = ToolRequest::new("pay", json!({"amount": 5})).cancel_token(token);
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the tool must not be called"
    );

    // an uncancelled request goes through
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("pay", json!({})))
        .await
        .unwrap();
    assert_eq!(res.output, json!("ran"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn cancellation_mid_call_drops_the_inner_future_and_yields_cancelled() {
    let dropped = Arc::new(AtomicBool::new(false));
    let saw_child_cancel = Arc::new(AtomicBool::new(false));
    let (d, s) = (dropped.clone(), saw_child_cancel.clone());
    let tool = service_fn(move |req: ToolRequest| {
        let flag = DropFlag(d.clone());
        let child = req.attempt_token().clone();
        let s = s.clone();
        // a task the tool spawned elsewhere watches the child token
        tokio::spawn(async move {
            child.cancelled().await;
            s.store(true, Ordering::SeqCst);
        });
        async move {
            let _flag = flag;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }
    });
    let mut svc = CancelLayer::new().layer(tool);

    let token = CancellationToken::new();
    let req = ToolRequest::new("search", json!({})).cancel_token(token.clone());
    let mut fut = Box::pin(svc.ready().await.unwrap().call(req));
    // run the call for a while: nothing happens
    tokio::select! {
        _ = &mut fut => panic!("must not finish"),
        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
    assert!(!dropped.load(Ordering::SeqCst));
    token.cancel();
    let started = tokio::time::Instant::now();
    let result = std::future::poll_fn(|cx| std::future::Future::poll(fut.as_mut(), cx)).await;
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "cancellation ends the call at once"
    );
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(
        dropped.load(Ordering::SeqCst),
        "inner future must be dropped on cancel"
    );
    tokio::task::yield_now().await;
    assert!(
        saw_child_cancel.load(Ordering::SeqCst),
        "the tool's child token fires"
    );

    // and the classifier never counts it as a failure
    let outcome = DefaultClassifier.classify(&Err::<ToolResponse, _>(err));
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(!outcome.counts_as_failure() && !outcome.is_retriable());
}

#[tokio::test(start_paused = true)]
async fn a_call_that_finishes_is_not_affected_by_a_later_cancel() {
    let tool = service_fn(|_req: ToolRequest| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
    });
    let token = CancellationToken::new();
    let req = ToolRequest::new("t", json!(null)).cancel_token(token.clone());
    let res = CancelLayer::new().layer(tool).oneshot(req).await.unwrap();
    token.cancel();
    assert_eq!(res.output, json!("ok"));
}

#[tokio::test(start_paused = true)]
async fn tool_errors_pass_through() {
    let tool = service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::new(ErrorKind::NotFound, "no such city"))
    });
    let err = CancelLayer::new()
        .layer(tool)
        .oneshot(ToolRequest::new("t", json!(null)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_gives_up_on_its_token_still_ends_the_call_cancelled() {
    // The tool watches its attempt token (as it should) and fails when it fires: that
    // failure is the cancellation's doing, so the caller is told CANCELLED, whichever
    // of the two is polled first.
    let tool = service_fn(|req: ToolRequest| {
        let token = req.attempt_token().clone();
        async move {
            token.cancelled().await;
            Err::<ToolResponse, _>(ToolError::new(ErrorKind::ExecutionFailed, "aborted"))
        }
    });
    let svc = CancelLayer::new().layer(tool);
    let token = CancellationToken::new();
    let req = ToolRequest::new("search", json!({})).cancel_token(token.clone());
    let call = tokio::spawn(svc.oneshot(req));
    tokio::time::sleep(Duration::from_secs(1)).await;
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert_eq!(
        DefaultClassifier.classify(&Err::<ToolResponse, _>(err)),
        Outcome::Cancelled
    );
}

#[tokio::test(start_paused = true)]
async fn a_success_that_is_already_there_wins_over_a_cancel() {
    let tool = service_fn(|req: ToolRequest| {
        let token = req.attempt_token().clone();
        async move {
            token.cancelled().await;
            Ok::<_, ToolError>(ToolResponse::new(json!("finished anyway")))
        }
    });
    let svc = CancelLayer::new().layer(tool);
    let token = CancellationToken::new();
    let req = ToolRequest::new("search", json!({})).cancel_token(token.clone());
    let call = tokio::spawn(svc.oneshot(req));
    tokio::time::sleep(Duration::from_secs(1)).await;
    token.cancel();
    let res = call.await.unwrap().unwrap();
    assert_eq!(res.output, json!("finished anyway"));
}
