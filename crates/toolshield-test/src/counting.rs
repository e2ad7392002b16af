//! [`CountingTool`]: a tool that counts its calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use tower::Service;

use crate::BoxedTool;

/// A tool that counts its calls, takes `delay` (tokio time, so a paused clock skips it),
/// and answers `answer(n)`, where `n` is the number of the call, from 1.
///
/// The call is counted when it is made, before the delay: a call dropped while it waits
/// still counts. Clones share the counter.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use toolshield_core::{ToolRequest, ToolResponse};
/// use toolshield_test::{call, CountingTool};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut tool = CountingTool::new(|n| Ok(ToolResponse::new(json!({ "n": n }))))
///     .delay(Duration::from_secs(5));
/// let resp = call(&mut tool, ToolRequest::new("t", json!(null))).await.unwrap();
/// assert_eq!(resp.output["n"], 1);
/// assert_eq!(tool.calls(), 1);
/// # }
/// ```
pub struct CountingTool<F> {
    calls: Arc<AtomicUsize>,
    delay: Duration,
    answer: F,
}

impl<F> CountingTool<F>
where
    F: Fn(usize) -> Result<ToolResponse, ToolError> + Clone + Send + Sync + 'static,
{
    /// A tool answering `answer(call number)` at once, with a counter of its own.
    #[must_use]
    pub fn new(answer: F) -> Self {
        Self::with_counter(&Arc::default(), answer)
    }

    /// A tool answering `answer(call number)` at once that counts on `calls` (shared with
    /// the test, or with other tools).
    #[must_use]
    pub fn with_counter(calls: &Arc<AtomicUsize>, answer: F) -> Self {
        CountingTool {
            calls: Arc::clone(calls),
            delay: Duration::ZERO,
            answer,
        }
    }

    /// Each call takes `delay` before it answers.
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// How many calls were made so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The shared counter.
    pub fn counter(&self) -> &Arc<AtomicUsize> {
        &self.calls
    }

    /// The tool, boxed.
    #[must_use]
    pub fn boxed(self) -> BoxedTool {
        BoxedTool::new(self)
    }
}

impl<F: Clone> Clone for CountingTool<F> {
    fn clone(&self) -> Self {
        CountingTool {
            calls: Arc::clone(&self.calls),
            delay: self.delay,
            answer: self.answer.clone(),
        }
    }
}

impl<F> std::fmt::Debug for CountingTool<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingTool")
            .field("calls", &self.calls)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl<F> Service<ToolRequest> for CountingTool<F>
where
    F: Fn(usize) -> Result<ToolResponse, ToolError> + Clone + Send + Sync + 'static,
{
    type Response = ToolResponse;
    type Error = ToolError;
    // Boxed: a test helper, not a hot path.
    type Future = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let (answer, delay) = (self.answer.clone(), self.delay);
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            answer(n)
        })
    }
}

/// [`CountingTool`] counting on `calls`, taking `delay`, boxed: the shape most behaviour
/// tests of the store layers want.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use serde_json::json;
/// use toolshield_core::{ToolRequest, ToolResponse};
/// use toolshield_test::counting_tool;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let calls = Arc::new(AtomicUsize::new(0));
/// let tool = counting_tool(&calls, Duration::ZERO, |n| {
///     Ok(ToolResponse::new(json!({ "n": n })))
/// });
/// let req = || ToolRequest::new("t", json!(null));
/// tool.clone().oneshot(req()).await.unwrap();
/// let second = tool.oneshot(req()).await.unwrap();
/// assert_eq!(second.output["n"], 2);
/// assert_eq!(calls.load(Ordering::SeqCst), 2);
/// # }
/// ```
pub fn counting_tool<F>(calls: &Arc<AtomicUsize>, delay: Duration, answer: F) -> BoxedTool
where
    F: Fn(usize) -> Result<ToolResponse, ToolError> + Clone + Send + Sync + 'static,
{
    CountingTool::with_counter(calls, answer)
        .delay(delay)
        .boxed()
}
