use std::sync::Arc;
use std::task::{Context, Poll};

use toolshield_contract::IntoToolError;
use toolshield_contract::{ShieldRequest, ToolError};
use toolshield_store::{take_ready, LayerFuture};
use tower_service::Service;

use crate::ledger::{Admission, BudgetLedger, ToolBudget};

/// The response future of [`Budget`]: the inner future untouched for an admitted call
/// (in memory), the error of a rejected one, or the store path (boxed: it awaits the
/// store, which is I/O anyway).
pub type ResponseFuture<F, R> = LayerFuture<F, R>;

/// Counts each call against its run's budget before it reaches the inner service.
///
/// A call is counted when it is admitted, at once and atomically: the tool's calls, the
/// run's calls and the run's cost are checked together and either all increased or none
/// (concurrent and nested calls of one run can never exceed a limit). An admitted call is
/// never refunded, whether it then fails, times out or is cancelled: the tool may have
/// done its work, and a refund would let a loop of failing calls run for ever. A call the
/// budget rejects costs nothing. The rejection is `BUDGET_EXHAUSTED` (never retried, not a
/// breaker failure), naming the limit but never the run or the caller.
///
/// Rejects in `call`, never in `poll_ready`; readiness is the inner service's.
pub struct Budget<S> {
    inner: S,
    ledger: BudgetLedger,
    tool: Arc<ToolBudget>,
}

impl<S> Budget<S> {
    pub(crate) fn new(inner: S, ledger: BudgetLedger, tool: Arc<ToolBudget>) -> Self {
        Budget {
            inner,
            ledger,
            tool,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The ledger the service charges.
    pub fn ledger(&self) -> &BudgetLedger {
        &self.ledger
    }
}

impl<S: Clone> Clone for Budget<S> {
    fn clone(&self) -> Self {
        Budget {
            inner: self.inner.clone(),
            ledger: self.ledger.clone(),
            tool: Arc::clone(&self.tool),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Budget<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("inner", &self.inner)
            .field("tool", &self.tool.name)
            .field("max_calls", &self.tool.max_calls)
            .field("cost", &self.tool.cost)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Service<Req> for Budget<S>
where
    Req: ShieldRequest + Send + 'static,
    S: Service<Req> + Clone + Send + 'static,
    S::Error: IntoToolError + Send,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future, S::Response>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        match self.ledger.admit(&self.tool, &req) {
            Admission::Pass => LayerFuture::passthrough(self.inner.call(req)),
            Admission::Reject(e) => LayerFuture::ready(Err(e)),
            Admission::Store(key) => {
                let mut inner = take_ready(&mut self.inner);
                let ledger = self.ledger.clone();
                let tool = Arc::clone(&self.tool);
                LayerFuture::boxed(Box::pin(async move {
                    // Dropped while the store answers: the charge may or may not have been
                    // applied, and the call never runs.
                    ledger.admit_in_store(&tool, &key).await?;
                    inner
                        .call(req)
                        .await
                        .map_err(IntoToolError::into_tool_error)
                }))
            }
        }
    }
}
