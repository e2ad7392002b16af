//! [`ResponseFuture`]: records the outcome of an admitted call, or yields the rejection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use toolshield_contract::{Classify, Outcome, ShieldResponse, ToolError};

use crate::state::{BreakerState, Record, Ticket, TicketKind};

/// A pinned breaker as one service (and its clones) holds it: the calls of that service
/// take their reference on this slot, so the count they write and release on every call
/// is the service's own, not the breaker's, which every service of the key shares
/// (threads building their own service share no written line on the closed path).
pub(crate) struct Slot {
    pub(crate) state: Arc<BreakerState>,
}

/// How a [`Breaker`](crate::Breaker) and its calls hold the breaker of their key: a
/// reference on the breaker itself ([`SharedHandle`], the services of
/// [`BreakerLayer`](crate::BreakerLayer)) or on a slot of the service's own
/// ([`SlotHandle`], the services of [`PinnedBreakerLayer`](crate::PinnedBreakerLayer)).
/// Chosen by type, so a call never branches on it. Sealed.
pub trait Handle: Clone + sealed::Sealed {}

/// A reference on a key's breaker itself, shared by every service of the key.
#[derive(Clone)]
pub struct SharedHandle(pub(crate) Arc<BreakerState>);

/// A reference on a pinned service's slot, shared by the service's clones only.
#[derive(Clone)]
pub struct SlotHandle(pub(crate) Arc<Slot>);

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedHandle").field(&self.0.key).finish()
    }
}

impl std::fmt::Debug for SlotHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SlotHandle")
            .field(&self.0.state.key)
            .finish()
    }
}

// The sealed trait names crate-private types; nothing outside the crate can name or
// implement it, so they never reach the public API.
#[allow(private_interfaces, private_bounds)]
pub(crate) mod sealed {
    use std::sync::Arc;

    use super::{BreakerState, SharedHandle, Slot, SlotHandle};
    use crate::registry::BreakerRegistry;

    /// What a [`Handle`](super::Handle) does, out of the public API.
    pub trait Sealed: Sized + Clone {
        /// The breaker.
        fn state(&self) -> &BreakerState;
        /// A new handle on `state`.
        fn of(state: Arc<BreakerState>) -> Self;

        /// The handle for a call with `key`: the service's cached one when it is for
        /// that key and still live, else one on the registry's breaker for `key`, which
        /// the service then caches (for a slot, one small allocation per change of key).
        #[inline(always)]
        fn lookup(registry: &BreakerRegistry, cached: &mut Option<Self>, key: &str) -> Self {
            if let Some(handle) = cached {
                let state = handle.state();
                if &*state.key == key && state.touch() {
                    return handle.clone();
                }
            }
            Self::look_up_again(registry, cached, key)
        }

        /// [`lookup`](Self::lookup)'s way out of the cache, kept off the call's path.
        #[cold]
        #[inline(never)]
        fn look_up_again(registry: &BreakerRegistry, cached: &mut Option<Self>, key: &str) -> Self {
            let handle = Self::of(registry.get_or_insert(key));
            *cached = Some(handle.clone());
            handle
        }
    }

    impl Sealed for SharedHandle {
        #[inline]
        fn state(&self) -> &BreakerState {
            &self.0
        }

        fn of(state: Arc<BreakerState>) -> Self {
            SharedHandle(state)
        }
    }

    impl Sealed for SlotHandle {
        #[inline]
        fn state(&self) -> &BreakerState {
            &self.0.state
        }

        fn of(state: Arc<BreakerState>) -> Self {
            SlotHandle(Arc::new(Slot { state }))
        }
    }
}

impl Handle for SharedHandle {}
impl Handle for SlotHandle {}

/// Holds an admitted call's ticket until its outcome is known. Dropped unfinished (the
/// caller dropped the future), a half-open probe gives its permit back and records
/// nothing.
pub(crate) struct CallGuard<H: Handle> {
    state: H,
    ticket: Ticket,
    /// With a `slow_call_duration` of the breaker's own: the call's start and that
    /// threshold, both on the registry clock; the outcome then reads the clock once more.
    slow_check: Option<(u64, u64)>,
    done: bool,
}

impl<H: Handle> CallGuard<H> {
    #[inline(always)]
    pub(crate) fn new(state: H, ticket: Ticket, slow_check: Option<(u64, u64)>) -> Self {
        CallGuard {
            state,
            ticket,
            slow_check,
            done: false,
        }
    }

    pub(crate) fn finish(mut self, outcome: Outcome, marked_slow: bool) {
        self.done = true;
        // Without a threshold of its own the breaker's shared config is not touched here.
        let slow = marked_slow
            || self.slow_check.is_some_and(|(start, threshold)| {
                self.state.state().now_nanos().saturating_sub(start) >= threshold
            });
        let record = match outcome {
            Outcome::Success => Record::Success { slow },
            Outcome::Failure(f) if f.counts_for_breaker => Record::Failure { slow },
            Outcome::Failure(_) | Outcome::Ignored | Outcome::Cancelled => Record::Ignore,
        };
        self.state.state().record(self.ticket, record);
    }
}

impl<H: Handle> Drop for CallGuard<H> {
    fn drop(&mut self) {
        if !self.done && self.ticket.kind == TicketKind::Probe {
            self.state.state().release_permit(self.ticket.epoch);
        }
    }
}

pin_project! {
    /// The future of [`Breaker`](crate::Breaker): the inner call, recorded when it
    /// completes, or the `CIRCUIT_OPEN` rejection.
    pub struct ResponseFuture<F, C, H: Handle = SharedHandle> {
        #[pin]
        kind: Kind<F, C, H>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C, H: Handle> {
        Called {
            #[pin]
            fut: F,
            guard: Option<CallGuard<H>>,
            classifier: C,
        },
        Rejected {
            error: Option<ToolError>,
        },
    }
}

impl<F, C, H: Handle> ResponseFuture<F, C, H> {
    pub(crate) fn called(fut: F, guard: CallGuard<H>, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                fut,
                guard: Some(guard),
                classifier,
            },
        }
    }

    pub(crate) fn rejected(error: ToolError) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
        }
    }
}

impl<F, C, H: Handle, Res, E> Future for ResponseFuture<F, C, H>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<ToolError>,
    C: Classify<Res>,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Rejected { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| ToolError::internal("breaker future polled after completion")))),
            KindProj::Called {
                fut,
                guard,
                classifier,
            } => {
                let result = ready!(fut.poll(cx)).map_err(Into::into);
                if let Some(guard) = guard.take() {
                    let outcome = classifier.classify(&result);
                    let slow = matches!(&result, Ok(res) if res.slow_call().is_some());
                    guard.finish(outcome, slow);
                }
                Poll::Ready(result)
            }
        }
    }
}
