use std::borrow::Cow;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use toolshield_contract::config::deadline_after;
use toolshield_contract::time;
use toolshield_contract::IntoToolError;
use toolshield_contract::{CallState, ShieldRequest, ToolError};
use toolshield_store::{take_ready, LayerFuture, StoreError};
use tower_service::Service;

use crate::config::OnStoreError;
use crate::gcra::{Decision, Turn};
use crate::layer::Shared;
use toolshield_contract::key::{ByName, KeyFn};

/// A keyed GCRA rate limiter (see [`RateLimit`](crate::RateLimit)).
///
/// Each call is decided in `call` against its key's bucket: admitted at once, admitted
/// after a wait (its turn is reserved; the wait is a tokio sleep until the turn's
/// instant, however late the future is first polled, and fits both `max_wait` and the
/// call's deadline), or rejected with `RATE_LIMITED` and the exact
/// `retry_after` (the time until the next conforming call). A call cancelled while it
/// waits (its future dropped, or its attempt token cancelled: it then ends at once with
/// `CANCELLED`, never reaching the inner service) gives its turn back. When the store
/// fails, the call runs unlimited (`allow`, the default) or fails with
/// `STORE_UNAVAILABLE` (`reject`); either way `store_errors` counts it.
///
/// `poll_ready` is the inner service's readiness. With an in-memory store the decision
/// takes a lock and a map lookup and allocates nothing; a remote store is awaited in a
/// boxed future that carries the ready inner service.
#[derive(Debug)]
pub struct RateLimiter<S, K = ByName> {
    inner: S,
    shared: Arc<Shared>,
    key: K,
}

impl<S: Clone, K: Clone> Clone for RateLimiter<S, K> {
    fn clone(&self) -> Self {
        RateLimiter {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            key: self.key.clone(),
        }
    }
}

impl<S, K> RateLimiter<S, K> {
    pub(crate) fn from_parts(inner: S, shared: Arc<Shared>, key: K) -> Self {
        RateLimiter { inner, shared, key }
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
}

/// The time a call that waited is left before its deadline, at least.
const DEADLINE_MARGIN: Duration = Duration::from_micros(1);

/// Gives a reserved turn back unless disarmed (the call started).
struct Refund {
    shared: Arc<Shared>,
    key: Option<String>,
    turn: Turn,
    armed: bool,
}

impl Drop for Refund {
    fn drop(&mut self) {
        if self.armed {
            self.shared
                .store
                .refund(self.key.as_deref(), &self.shared.limit, self.turn);
        }
    }
}

fn rejected(shared: &Shared, name: Option<&str>, retry_after: Duration) -> ToolError {
    shared.counters.rejected.bump();
    let l = &shared.limit;
    let message = match name {
        Some(n) => format!(
            "rate limit of {} per {:?} reached for `{n}`",
            l.rate(),
            l.period()
        ),
        None => format!("rate limit of {} per {:?} reached", l.rate(), l.period()),
    };
    ToolError::rate_limited(message, Some(retry_after))
}

fn cancelled_while_waiting() -> ToolError {
    ToolError::cancelled("call cancelled while waiting for its rate-limit turn")
}

/// What fires when the caller cancels `req`: its attempt token (a child of the call
/// token), watched while the call waits for its turn.
fn attempt_cancelled<Req: ShieldRequest>(req: &Req) -> Option<impl Future<Output = ()>> {
    req.call_state()
        .map(|state| state.tokens().attempt().clone().cancelled_owned())
}

/// Sleeps until the call's turn at `until`, unless `cancelled` (the call's attempt token)
/// fires first: then `false`, at once. An instant, not a duration: a future first polled
/// late still starts at its turn, never past it (nor past its deadline).
async fn wait_turn(until: Instant, cancelled: Option<impl Future<Output = ()>>) -> bool {
    let mut sleep = pin!(tokio::time::sleep_until(until));
    let mut cancelled = pin!(cancelled);
    poll_fn(|cx| {
        if let Some(c) = cancelled.as_mut().as_pin_mut() {
            if c.poll(cx).is_ready() {
                return Poll::Ready(false);
            }
        }
        sleep.as_mut().poll(cx).map(|()| true)
    })
    .await
}

fn store_failed(shared: &Shared, e: &StoreError) -> Option<ToolError> {
    shared.counters.store_errors.bump();
    tracing::warn!(target: "toolshield::ratelimit", error = %e, "rate limit store failed");
    match shared.on_store_error {
        OnStoreError::Allow => None,
        OnStoreError::Reject => Some(e.clone().into()),
    }
}

impl<S, K, Req> Service<Req> for RateLimiter<S, K>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: IntoToolError + Send,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    K: KeyFn<Req>,
    Req: ShieldRequest + Send + 'static,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = LayerFuture<S::Future, S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &self.shared;
        let mut deadline = None;
        let max_wait = match shared.max_wait {
            None => Duration::ZERO,
            Some(max) => match req.call_state().and_then(CallState::deadline) {
                // The wait must end before the deadline, leaving the call some time.
                Some(d) => {
                    deadline = Some(d);
                    max.min(
                        d.saturating_duration_since(time::now())
                            .saturating_sub(DEADLINE_MARGIN),
                    )
                }
                None => max,
            },
        };
        let key = self.key.key(&req);
        let decided = shared
            .store
            .acquire_now(key.as_deref(), &shared.limit, max_wait);
        match decided {
            Some(Ok(Decision::Admit { wait, .. })) if wait.is_zero() => {
                shared.counters.admitted.bump();
                LayerFuture::passthrough(self.inner.call(req))
            }
            Some(Ok(Decision::Admit { wait, turn })) => {
                shared.counters.waited.bump();
                // The turn is an instant from now, when it was reserved: not a wait from
                // the future's first poll, which may come later.
                let until = deadline_after(time::now(), wait);
                let refund = Refund {
                    shared: Arc::clone(shared),
                    key: key.map(Cow::into_owned),
                    turn,
                    armed: true,
                };
                let mut svc = take_ready(&mut self.inner);
                let cancelled = attempt_cancelled(&req);
                LayerFuture::boxed(Box::pin(async move {
                    let mut refund = refund;
                    if !wait_turn(until, cancelled).await {
                        // The turn goes back with the armed refund.
                        return Err(cancelled_while_waiting());
                    }
                    refund.armed = false;
                    refund.shared.counters.admitted.bump();
                    svc.call(req).await.map_err(IntoToolError::into_tool_error)
                }))
            }
            Some(Ok(Decision::Reject { retry_after })) => {
                LayerFuture::ready(Err(rejected(shared, req.call_name(), retry_after)))
            }
            Some(Err(e)) => match store_failed(shared, &e) {
                Some(err) => LayerFuture::ready(Err(err)),
                None => {
                    shared.counters.admitted.bump();
                    LayerFuture::passthrough(self.inner.call(req))
                }
            },
            None => {
                // A remote store: one round trip, then the same decisions.
                let shared = Arc::clone(shared);
                let key = key.map(Cow::into_owned);
                let mut svc = take_ready(&mut self.inner);
                LayerFuture::boxed(Box::pin(async move {
                    let decided = shared
                        .store
                        .acquire(key.as_deref(), &shared.limit, max_wait)
                        .await;
                    match decided {
                        Ok(Decision::Admit { wait, turn }) => {
                            if !wait.is_zero() {
                                let mut refund = Refund {
                                    shared: Arc::clone(&shared),
                                    key,
                                    turn,
                                    armed: true,
                                };
                                // The answer took time to come back: the wait the store
                                // decided starts now, and must still end before the
                                // deadline. Else the turn is given back (the guard).
                                if deadline.is_some_and(|d| {
                                    d.saturating_duration_since(time::now())
                                        .saturating_sub(DEADLINE_MARGIN)
                                        < wait
                                }) {
                                    return Err(rejected(&shared, req.call_name(), wait));
                                }
                                shared.counters.waited.bump();
                                let until = deadline_after(time::now(), wait);
                                if !wait_turn(until, attempt_cancelled(&req)).await {
                                    return Err(cancelled_while_waiting());
                                }
                                refund.armed = false;
                            }
                        }
                        Ok(Decision::Reject { retry_after }) => {
                            return Err(rejected(&shared, req.call_name(), retry_after));
                        }
                        Err(e) => {
                            if let Some(err) = store_failed(&shared, &e) {
                                return Err(err);
                            }
                        }
                    }
                    shared.counters.admitted.bump();
                    svc.call(req).await.map_err(IntoToolError::into_tool_error)
                }))
            }
        }
    }
}
