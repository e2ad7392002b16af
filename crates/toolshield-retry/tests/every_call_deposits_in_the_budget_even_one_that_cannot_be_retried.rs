//! The retry budget follows tower's `Budget` discipline (docs/retry.md, "Retry budget":
//! "every call deposits `ratio` of a token; every retry withdraws one"): a call deposits
//! whether or not it could ever be retried (a keyless mutation, a success), and only
//! retries withdraw. On tokio's paused clock.

mod common;

use std::sync::Arc;

use common::{err, ok, read_request};
use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolRequest};
use toolshield_retry::{BackoffStrategy, RetryBudget, RetryLayer};
use toolshield_test::ScriptedTool;
use tower::{Layer, ServiceExt};

#[tokio::test(start_paused = true)]
async fn deposits_of_calls_that_are_never_retried_pay_for_a_later_retry() {
    // Half a token per call, no floor: nothing to spend at first.
    let budget = Arc::new(RetryBudget::new(0.5, 0, 10));
    let layer = RetryLayer::new(3)
        .with_backoff(BackoffStrategy::none())
        .with_budget(budget.clone());

    // A failing read with an empty budget is not retried (its own deposit is half a
    // token).
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), ok()]);
    let e = layer
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.attempts(), tool.calls()),
        (ErrorKind::Timeout, 1, 1)
    );
    assert_eq!(budget.available(), 0);

    // A keyless mutation (never retried) that fails deposits anyway: with the read's
    // half token that makes one.
    let tool = ScriptedTool::new([err(ErrorKind::ConnectionFailed)]);
    let pay = ToolRequest::new("pay", json!({"amount": 1})).kind(CallKind::Mutating);
    let e = layer.layer(tool.service()).oneshot(pay).await.unwrap_err();
    assert_eq!((e.attempts(), tool.calls()), (1, 1));
    assert_eq!(budget.available(), 1);

    // The next failing read is retried once on that token (and its own half).
    let tool = ScriptedTool::new([err(ErrorKind::Timeout), err(ErrorKind::Timeout), ok()]);
    let e = layer
        .layer(tool.service())
        .oneshot(read_request())
        .await
        .unwrap_err();
    assert_eq!((e.attempts(), tool.calls()), (2, 2));
    assert_eq!(budget.available(), 0);
}
