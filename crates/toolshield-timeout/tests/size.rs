//! What the timeout adds to the future it wraps: the timer (tokio's `Sleep`, armed only
//! if the tool returns `Pending`) and a few words of its own state. A field added to the
//! future without need shows here.

use std::future::Ready;
use std::mem::size_of;
use std::time::Duration;

use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_timeout::{Timeout, TimeoutLayer};
use tower::{Layer, Service};

type Inner = Ready<Result<ToolResponse, ToolError>>;

#[derive(Clone)]
struct Tool;

impl Service<ToolRequest> for Tool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Inner;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ToolError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ToolRequest) -> Inner {
        std::future::ready(Ok(ToolResponse::new(serde_json::Value::Null)))
    }
}

/// The timeout's own state beyond the inner future and the timer: the expiry, the
/// attempt's start, the kind of limit, the soft threshold, the attempt guard and the idle
/// clock.
const OWN_STATE_AT_MOST: usize = 104;

#[test]
fn the_timeout_future_is_the_inner_future_the_timer_and_a_few_words() {
    let svc: Timeout<Tool> = TimeoutLayer::new(Duration::from_secs(1)).layer(Tool);
    let _ = svc;
    let future = size_of::<<Timeout<Tool> as Service<ToolRequest>>::Future>();
    let inner = size_of::<Inner>();
    let timer = size_of::<tokio::time::Sleep>();
    let own = future.saturating_sub(inner + timer);
    println!("timeout future: {future} bytes = inner {inner} + timer {timer} + {own}");
    assert!(
        own <= OWN_STATE_AT_MOST,
        "the timeout adds {own} bytes of its own beyond the inner future and the timer, at most {OWN_STATE_AT_MOST} expected"
    );
}
