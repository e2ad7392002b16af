//! What a call that succeeds first time carries: the inner future, the request copy kept
//! for a retry, and a few words. The state only a retry needs (the caller's token, the
//! timer, the service clone, the backoff, the attempt guard, the budget token) is boxed
//! when the first retry is planned.

use std::mem::{size_of, size_of_val};

use serde_json::json;
use toolshield_core::{CallKind, ToolRequest};
use toolshield_retry::RetryLayer;
use toolshield_test::BareTool;
use tower::{Layer, Service};

/// Beyond the inner future and the request copy: the shared state's pointer, the attempt
/// number and the state's tag, and the pointer to the retry's box.
const WORDS_OVER_INNER_AND_REQUEST: usize = 3;

#[test]
fn a_first_attempt_carries_only_the_inner_future_the_request_copy_and_three_words() {
    let mut bare = BareTool;
    let inner = size_of_val(&bare.call(ToolRequest::new("weather", json!({}))));
    let mut svc = RetryLayer::default().layer(BareTool);
    let fut = svc.call(ToolRequest::new("weather", json!({})).kind(CallKind::ReadOnly));
    let size = size_of_val(&fut);
    let request = size_of::<ToolRequest>();
    let bound = inner + request + WORDS_OVER_INNER_AND_REQUEST * size_of::<usize>();
    assert!(
        size <= bound,
        "the retry future is {size} bytes; at most {bound} expected \
         (inner future {inner}, request copy {request}, and {WORDS_OVER_INNER_AND_REQUEST} words)"
    );
}
