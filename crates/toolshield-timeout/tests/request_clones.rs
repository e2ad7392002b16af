//! Clones of one request sent as calls of their own: one call's timeout must not cancel
//! the token another call's tool watches.

use std::future::Future;
use std::time::Duration;

use serde_json::json;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_timeout::TimeoutLayer;
use tower::{service_fn, Layer, ServiceExt};

/// A tool that works for `secs` seconds, ignoring its token, then answers whether its
/// attempt token was cancelled meanwhile.
fn tool(
    secs: u64,
) -> impl tower::Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl Future<Output = Result<ToolResponse, ToolError>>,
> + Clone {
    service_fn(move |req: ToolRequest| async move {
        tokio::time::sleep(Duration::from_secs(secs)).await;
        Ok(ToolResponse::new(
            json!({ "attempt_cancelled": req.attempt_token().is_cancelled() }),
        ))
    })
}

#[tokio::test(start_paused = true)]
async fn one_clones_timeout_does_not_cancel_another_clones_attempt() {
    // The slow call times out at 2 s; the steady one works until 3 s under a 4 s limit.
    let slow = TimeoutLayer::new(Duration::from_secs(2)).layer(tool(5));
    let steady = TimeoutLayer::new(Duration::from_secs(4)).layer(tool(3));
    let template = ToolRequest::new("t", json!({"q": 1}));

    let (slow, steady) = tokio::join!(
        slow.oneshot(template.clone()),
        steady.oneshot(template.clone())
    );
    assert_eq!(
        slow.expect_err("the slow call times out").kind(),
        ErrorKind::Timeout
    );
    let steady = steady.expect("the steady call finishes within its own timeout");
    assert_eq!(
        steady.output,
        json!({"attempt_cancelled": false}),
        "the other call's timeout cancelled this call's attempt token"
    );
    // The template itself was never sent: its tokens are untouched.
    assert!(!template.attempt_token().is_cancelled());
    assert!(!template.call_token().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_template_whose_attempt_token_was_made_is_not_cancelled_by_its_clones() {
    let slow = TimeoutLayer::new(Duration::from_secs(2)).layer(tool(5));
    let template = ToolRequest::new("t", json!({"q": 1}));
    // Someone watches the template's attempt token before any clone is sent.
    let watched = template.attempt_token().clone();
    let err = slow.oneshot(template.clone()).await.expect_err("times out");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(
        !watched.is_cancelled(),
        "a clone's timeout cancelled the template's attempt token"
    );
}

#[tokio::test(start_paused = true)]
async fn the_callers_own_token_still_cancels_every_clone() {
    // The call token is the caller's: clones share it, and cancelling it reaches all.
    let steady = TimeoutLayer::new(Duration::from_secs(10)).layer(service_fn(
        |req: ToolRequest| async move {
            req.attempt_token().cancelled().await;
            Err::<ToolResponse, _>(ToolError::cancelled("gave up"))
        },
    ));
    let template = ToolRequest::new("t", json!({"q": 1}));
    let caller = template.call_token().clone();
    let cancel = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        caller.cancel();
    };
    let (a, b, ()) = tokio::join!(
        steady.clone().oneshot(template.clone()),
        steady.clone().oneshot(template.clone()),
        cancel
    );
    assert_eq!(a.expect_err("cancelled").kind(), ErrorKind::Cancelled);
    assert_eq!(b.expect_err("cancelled").kind(), ErrorKind::Cancelled);
}
