use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use toolshield_contract::IntoToolError;
use toolshield_contract::{
    idempotency_key_of, CallKind, Classify, ShieldRequest, ShieldResponse, ToolError,
};
use tower_service::Service;

use crate::budget::RetryBudget;
use crate::future::ResponseFuture;
use crate::shared::Shared;

/// Retries calls of the inner service; built by [`RetryLayer`](crate::RetryLayer).
///
/// A first attempt calls the ready inner service itself. A retry calls a clone of the
/// inner service (taken once, at the first call that may be retried, and shared by this
/// service's clones), polled ready before each retry. So a call that succeeds first
/// time clones no service, and a service mutated through [`get_mut`](Self::get_mut)
/// after its first call is retried as it was then.
pub struct Retry<S, P> {
    inner: S,
    shared: Arc<Shared<P, S>>,
}

impl<S, P> Retry<S, P> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<P, S>>) -> Self {
        Retry { inner, shared }
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

    /// The retry budget, if one is set.
    pub fn budget(&self) -> Option<&Arc<RetryBudget>> {
        self.shared.budget.as_ref()
    }
}

impl<S: Clone, P> Clone for Retry<S, P> {
    fn clone(&self) -> Self {
        Retry {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, P> fmt::Debug for Retry<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("max_attempts", &self.shared.max_attempts)
            .field("budget", &self.shared.budget)
            .finish_non_exhaustive()
    }
}

impl<S, P, Req, Res> Service<Req> for Retry<S, P>
where
    S: Service<Req, Response = Res> + Clone,
    S::Error: IntoToolError,
    Req: ShieldRequest + Clone,
    Res: ShieldResponse,
    P: Classify<Res>,
{
    type Response = Res;
    type Error = ToolError;
    type Future = ResponseFuture<S, Req, P>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    #[inline(always)]
    fn call(&mut self, mut req: Req) -> Self::Future {
        // The call's own tokens before the copy is made: the copy shares them.
        toolshield_contract::own_call(&mut req);
        // A mutating call without an idempotency key (a blank one is none) is never
        // repeated: keep no copy. A request that states no kind (a plain value) is
        // retried as tower's `Retry` would: the policy decides.
        let may_retry = self.shared.max_attempts > 1
            && !(req.call_kind() == Some(CallKind::Mutating) && idempotency_key_of(&req).is_none());
        let retry_req = may_retry.then(|| req.clone());
        if let Some(budget) = &self.shared.budget {
            budget.deposit();
        }
        if let Some(copy) = &retry_req {
            self.shared.keep_template(&self.inner);
            // A claim on the call (a mutation's idempotency key) learns where this
            // retry's attempts begin, so a refused attempt can undo its mark.
            if let Some(state) = copy.call_state() {
                state.retry_begins();
            }
        }
        let future = self.inner.call(req);
        ResponseFuture::new(future, retry_req, Arc::clone(&self.shared))
    }
}
