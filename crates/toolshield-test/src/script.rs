//! [`ScriptedTool`]: a tool that answers from a script and records its calls.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::Service;

/// One call a [`ScriptedTool`] saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When it was made (tokio time).
    pub at: Instant,
    /// The request's attempt number.
    pub attempt: u32,
    /// The request's execution id.
    pub execution_id: String,
    /// The request's per-attempt cancellation token.
    pub attempt_token: CancellationToken,
}

type Step = (Duration, Result<ToolResponse, ToolError>);

#[derive(Default)]
struct Inner {
    steps: VecDeque<Step>,
    seen: Vec<Seen>,
}

/// A tool that answers each call with the next step of its script (a delay, then a
/// result), succeeds with `{"ok": true}` once the script is used up, and records every
/// call ([`Seen`]). Clones share the script and the record.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use toolshield_core::{ErrorKind, ToolError, ToolRequest};
/// use toolshield_test::{call, gaps, ScriptedTool};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let script = ScriptedTool::steps([
///     (Duration::from_secs(2), Err(ToolError::new(ErrorKind::Timeout, "slow"))),
///     (Duration::ZERO, Err(ToolError::new(ErrorKind::Timeout, "slow"))),
/// ]);
/// let mut tool = script.service();
/// let req = || ToolRequest::new("weather", json!({}));
/// assert!(call(&mut tool, req()).await.is_err());
/// assert!(call(&mut tool, req()).await.is_err());
/// assert_eq!(call(&mut tool, req()).await.unwrap().output, json!({"ok": true}));
/// assert_eq!(gaps(&script.seen()), [Duration::from_secs(2), Duration::ZERO]);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct ScriptedTool {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for ScriptedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("ScriptedTool")
            .field("steps_left", &inner.steps.len())
            .field("calls", &inner.seen.len())
            .finish()
    }
}

impl ScriptedTool {
    /// Answers with `results` in order, each at once.
    #[must_use]
    pub fn new(results: impl IntoIterator<Item = Result<ToolResponse, ToolError>>) -> Self {
        Self::steps(results.into_iter().map(|r| (Duration::ZERO, r)))
    }

    /// Answers each call after its delay (tokio time) with its result, in order.
    #[must_use]
    pub fn steps(
        steps: impl IntoIterator<Item = (Duration, Result<ToolResponse, ToolError>)>,
    ) -> Self {
        ScriptedTool {
            inner: Arc::new(Mutex::new(Inner {
                steps: steps.into_iter().collect(),
                seen: Vec::new(),
            })),
        }
    }

    /// Fails every call (10 000 of them) with `kind`.
    #[must_use]
    pub fn always(kind: ErrorKind) -> Self {
        Self::new((0..10_000).map(move |_| Err(ToolError::new(kind, "scripted failure"))))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calls seen so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// How many calls were made so far.
    pub fn calls(&self) -> usize {
        self.lock().seen.len()
    }

    /// The tool as a service: a clone sharing the script and the record.
    #[must_use]
    pub fn service(&self) -> Self {
        self.clone()
    }
}

impl Service<ToolRequest> for ScriptedTool {
    type Response = ToolResponse;
    type Error = ToolError;
    // Boxed: a test helper, not a hot path.
    type Future = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let (delay, result) = {
            let mut inner = self.lock();
            inner.seen.push(Seen {
                at: Instant::now(),
                attempt: req.attempt(),
                execution_id: req.execution_id().to_string(),
                attempt_token: req.attempt_token().clone(),
            });
            inner
                .steps
                .pop_front()
                .unwrap_or_else(|| (Duration::ZERO, Ok(ToolResponse::new(json!({"ok": true})))))
        };
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            result
        })
    }
}

/// The gaps between consecutive calls.
///
/// ```
/// use toolshield_test::gaps;
/// assert!(gaps(&[]).is_empty());
/// ```
pub fn gaps(seen: &[Seen]) -> Vec<Duration> {
    seen.windows(2).map(|w| w[1].at - w[0].at).collect()
}
