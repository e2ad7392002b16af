use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio_util::sync::CancellationToken;
use toolshield_contract::config::deadline_after;
use toolshield_contract::time;
use toolshield_contract::IntoToolError;
use toolshield_contract::{CallState, ErrorKind, ShieldRequest, ToolError};
use tower_service::Service;

use crate::future::{cancelled_while_queued, ResponseFuture};
use crate::gate::{Gate, Gates};
use crate::layer::{Shared, Whole};
use toolshield_contract::key::KeyFn;

/// A bulkhead: at most `max_concurrent` calls of the inner service in flight (per key,
/// with a keyed layer); beyond that a call waits in a bounded FIFO queue for at most the
/// queue timeout (and never past its deadline), or is rejected at once when the queue is
/// full or absent. A rejection is `OVERLOADED`: retriable, and never a breaker failure.
///
/// `poll_ready` is the inner service's readiness and never waits for a slot: admission
/// happens in `call` (a free slot is taken at once; a queued call carries the ready inner
/// service into its future), so a busy key never holds up the others, and a full
/// bulkhead answers at once instead of stalling the caller as tower's `ConcurrencyLimit`
/// does. The slot is given back when the call ends, fails, panics or its future is
/// dropped; a queued call whose future is dropped, or whose attempt token is cancelled
/// (then `CANCELLED`, not counted as a rejection), leaves the queue at once.
#[derive(Debug)]
pub struct Bulkhead<S, K = Whole> {
    inner: S,
    shared: Arc<Shared>,
    key: K,
}

impl<S: Clone, K: Clone> Clone for Bulkhead<S, K> {
    fn clone(&self) -> Self {
        Bulkhead {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            key: self.key.clone(),
        }
    }
}

impl<S, K> Bulkhead<S, K> {
    pub(crate) fn from_parts(inner: S, shared: Arc<Shared>, key: K) -> Self {
        Bulkhead { inner, shared, key }
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

    fn reject<F, Req>(
        &self,
        name: Option<&str>,
        why: std::fmt::Arguments<'_>,
    ) -> ResponseFuture<F, S, Req> {
        self.shared
            .counters
            .rejected
            .fetch_add(1, Ordering::Relaxed);
        let message = match name {
            Some(n) => format!("bulkhead full for `{n}`: {why}"),
            None => format!("bulkhead full: {why}"),
        };
        ResponseFuture::failed(ToolError::new(ErrorKind::Overloaded, message))
    }

    fn enter<Req>(&mut self, gate: &Arc<Gate>, req: Req) -> ResponseFuture<S::Future, S, Req>
    where
        S: Service<Req> + Clone,
        Req: ShieldRequest,
    {
        if let Some(permit) = gate.try_enter() {
            return ResponseFuture::running(self.inner.call(req), permit);
        }
        let limits = self.shared.limits;
        if limits.max_queue == 0 {
            return self.reject(
                req.call_name(),
                format_args!("{} calls in flight", limits.max_concurrent),
            );
        }
        let now = time::now();
        let mut until = deadline_after(now, limits.queue_timeout);
        if let Some(deadline) = req.call_state().and_then(CallState::deadline) {
            until = until.min(deadline);
        }
        if until <= now {
            return self.reject(
                req.call_name(),
                format_args!(
                    "{} calls in flight and no time left to wait",
                    limits.max_concurrent
                ),
            );
        }
        // The attempt token (a child of the call token): a waiter cancelled by its caller
        // leaves the queue at once, and a call cancelled already takes no place in it.
        let token = req
            .call_state()
            .map(|state| state.tokens().attempt().clone());
        if token.as_ref().is_some_and(CancellationToken::is_cancelled) {
            return ResponseFuture::failed(cancelled_while_queued());
        }
        let Some(place) = gate.try_queue(limits.max_queue) else {
            return self.reject(
                req.call_name(),
                format_args!(
                    "{} calls in flight and {} waiting",
                    limits.max_concurrent, limits.max_queue
                ),
            );
        };
        // Takes its place in the semaphore's FIFO queue now, in the order of `call`, not
        // when the caller first polls: a slot freed from here on goes to the calls
        // queued before any later one, and a newcomer finds no free slot to jump the
        // queue with. The caller's first poll puts its own waker in place of this one.
        let mut wait = place.wait();
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(permit) = wait.as_mut().poll(&mut cx) {
            // A slot freed since `try_enter`.
            drop(place);
            return match permit {
                Some(permit) => ResponseFuture::running(self.inner.call(req), permit),
                None => ResponseFuture::failed(ToolError::internal("bulkhead closed")),
            };
        }
        // The ready service goes with the call; the one left behind polls readiness
        // again before its next call.
        let clone = self.inner.clone();
        let svc = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::queued(
            place,
            wait,
            until,
            token,
            svc,
            req,
            Arc::clone(&self.shared),
        )
    }
}

impl<S, K, Req> Service<Req> for Bulkhead<S, K>
where
    S: Service<Req> + Clone,
    S::Error: IntoToolError,
    K: KeyFn<Req>,
    Req: ShieldRequest,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future, S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        match &shared.gates {
            Gates::One(gate) => self.enter(gate, req),
            Gates::Keyed(gates) => {
                let gate = gates.gate(self.key.key(&req).as_deref());
                match gate {
                    Some(gate) => self.enter(&gate, req),
                    None => self.reject(req.call_name(), format_args!("too many keys in use")),
                }
            }
        }
    }
}
