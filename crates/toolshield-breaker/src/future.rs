//! [`ResponseFuture`]: records the outcome of an admitted call, or yields the rejection.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use toolshield_contract::IntoToolError;
use toolshield_contract::{Classify, Outcome, ShieldResponse, ToolError};

use crate::registry::BreakerRegistry;
use crate::state::{BreakerState, Record, Ticket, TicketKind};

/// The breaker for a call with `key`: the service's `cached` one when it is for that key
/// and still held by the registry, else the registry's breaker for `key`, which the
/// service then caches.
#[inline(always)]
pub(crate) fn lookup(
    registry: &BreakerRegistry,
    cached: &mut Option<Arc<BreakerState>>,
    key: &str,
) -> Arc<BreakerState> {
    if let Some(state) = cached {
        if same_key(&state.key, key) && state.touch() {
            return reuse(state);
        }
    }
    look_up_again(registry, cached, key)
}

/// [`lookup`]'s way out of the cache, kept off the call's path.
#[cold]
#[inline(never)]
fn look_up_again(
    registry: &BreakerRegistry,
    cached: &mut Option<Arc<BreakerState>>,
    key: &str,
) -> Arc<BreakerState> {
    let state = registry.get_or_insert(key);
    *cached = Some(Arc::clone(&state));
    state
}

// Each thread keeps the reference its last finished call held on a breaker: its next call
// on that breaker takes it instead of cloning one, so a thread calling one breaker again
// and again (the closed path's common case) writes no reference count, and threads
// sharing a hot breaker share no written line. The spare of a thread is replaced by the
// next call it finishes on another breaker, and dropped when the thread exits; a breaker
// the registry no longer holds is never kept.
thread_local! {
    static SPARE: Cell<Option<Arc<BreakerState>>> = const { Cell::new(None) };
}

/// Another reference on `state` for a call to hold: the thread's spare when it is one, a
/// clone otherwise.
#[inline(always)]
fn reuse(state: &Arc<BreakerState>) -> Arc<BreakerState> {
    match take_spare() {
        Some(spare) if Arc::ptr_eq(&spare, state) => spare,
        Some(other) => {
            put_spare(other);
            Arc::clone(state)
        }
        None => Arc::clone(state),
    }
}

/// Ends a finished call's hold on its breaker: kept as the thread's spare, in place of the
/// one kept before (which is dropped), unless the registry no longer holds the breaker.
#[inline(always)]
pub(crate) fn give_back(state: Arc<BreakerState>) {
    if !state.is_evicted() {
        put_spare(state);
    }
}

#[cfg(not(all(test, toolshield_loom)))]
#[inline(always)]
fn take_spare() -> Option<Arc<BreakerState>> {
    SPARE.try_with(Cell::take).ok().flatten()
}

#[cfg(not(all(test, toolshield_loom)))]
#[inline(always)]
fn put_spare(state: Arc<BreakerState>) {
    // The one replaced is dropped once the cell is set, outside any use of it (a
    // breaker's drop may run callbacks, which may call a breaker again).
    let replaced = SPARE
        .try_with(|spare| spare.replace(Some(state)))
        .ok()
        .flatten();
    drop(replaced);
}

// Under loom the breakers' atomics belong to one model execution: no reference may
// outlive it in a thread-local.
#[cfg(all(test, toolshield_loom))]
fn take_spare() -> Option<Arc<BreakerState>> {
    None
}

#[cfg(all(test, toolshield_loom))]
fn put_spare(state: Arc<BreakerState>) {
    drop(state);
}

/// The calling thread's spare reference, taken out (for tests).
#[cfg(test)]
pub(crate) fn take_thread_spare() -> Option<Arc<BreakerState>> {
    take_spare()
}

/// `a == b`, for the short names breakers are keyed by, without a call into `memcmp`:
/// keys of 4 to 16 bytes are compared as two overlapping words.
#[inline(always)]
fn same_key(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let n = a.len();
    match n {
        8..=16 => word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8),
        4..=7 => word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4),
        _ => a == b,
    }
}

/// The `N` bytes of `s` from `at` as one number (0 past the end, which `same_key`'s
/// lengths rule out).
#[inline(always)]
fn word<const N: usize>(s: &[u8], at: usize) -> u64 {
    let mut out = [0u8; 8];
    if let Some(bytes) = s.get(at..at + N) {
        out[..N].copy_from_slice(bytes);
    }
    u64::from_le_bytes(out)
}

/// Holds an admitted call's ticket until its outcome is known. Dropped unfinished (the
/// caller dropped the future), a half-open probe gives its permit back and records
/// nothing.
pub(crate) struct CallGuard {
    /// `None` only once the call is finished and its handle given back.
    state: Option<Arc<BreakerState>>,
    ticket: Ticket,
    /// The call's start on the registry clock, read only when the breaker has a
    /// `slow_call_duration` of its own (0 otherwise); the outcome then reads the clock
    /// once more.
    start: u64,
}

impl CallGuard {
    /// Admitted by `state` with `ticket`: reads the clock for the slow-call check only
    /// when the breaker has a threshold of its own.
    #[inline(always)]
    pub(crate) fn new(state: Arc<BreakerState>, ticket: Ticket) -> Self {
        let breaker = &*state;
        let start = match breaker.slow_threshold_nanos() {
            Some(_) => breaker.now_nanos(),
            None => 0,
        };
        CallGuard {
            state: Some(state),
            ticket,
            start,
        }
    }

    /// Whether the call's outcome is still to be recorded.
    #[inline(always)]
    pub(crate) fn is_pending(&self) -> bool {
        self.state.is_some()
    }

    /// Records the call's outcome and gives the handle back; once only (a second outcome
    /// is ignored).
    #[inline(always)]
    pub(crate) fn finish(&mut self, outcome: Outcome, marked_slow: bool) {
        let Some(breaker) = self.state.take() else {
            return;
        };
        // Without a threshold of its own the clock is not read here.
        let slow = marked_slow
            || breaker.slow_threshold_nanos().is_some_and(|threshold| {
                breaker.now_nanos().saturating_sub(self.start) > threshold
            });
        let record = match outcome {
            Outcome::Success => Record::Success { slow },
            Outcome::Failure(f) if f.counts_for_breaker => Record::Failure { slow },
            Outcome::Failure(_) | Outcome::Ignored | Outcome::Cancelled => Record::Ignore,
        };
        breaker.record(self.ticket, record);
        give_back(breaker);
    }
}

impl Drop for CallGuard {
    #[inline]
    fn drop(&mut self) {
        // Finished, the handle is gone and a probe's permit went back with its outcome.
        if let Some(breaker) = &self.state {
            if self.ticket.kind == TicketKind::Probe {
                breaker.release_permit(self.ticket.epoch);
            }
        }
    }
}

pin_project! {
    /// The future of [`Breaker`](crate::Breaker): the inner call, recorded when it
    /// completes, or the `CIRCUIT_OPEN` rejection.
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F>,
        classifier: C,
    }
}

pin_project! {
    // One variant per path: an admitted call's future lies beside its guard, with no
    // discriminant of its own.
    #[project = KindProj]
    enum Kind<F> {
        Called {
            #[pin]
            fut: F,
            guard: CallGuard,
        },
        Rejected {
            error: Option<ToolError>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    #[inline(always)]
    pub(crate) fn called(fut: F, guard: CallGuard, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Called { fut, guard },
            classifier,
        }
    }

    pub(crate) fn rejected(error: ToolError, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
            classifier,
        }
    }
}

impl<F, C, Res, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Res, E>>,
    E: IntoToolError,
    C: Classify<Res>,
    Res: ShieldResponse,
{
    type Output = Result<Res, ToolError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (fut, guard) = match this.kind.project() {
            KindProj::Called { fut, guard } => (fut, guard),
            KindProj::Rejected { error } => return Poll::Ready(Err(take_rejection(error))),
        };
        let result = ready!(fut.poll(cx)).map_err(IntoToolError::into_tool_error);
        // Recorded once: a guard already finished ignores a second outcome.
        if guard.is_pending() {
            let outcome = this.classifier.classify(&result);
            let slow = matches!(&result, Ok(res) if res.slow_call().is_some());
            guard.finish(outcome, slow);
        }
        Poll::Ready(result)
    }
}

/// The rejection a rejected call's future yields, once.
#[cold]
#[inline(never)]
fn take_rejection(error: &mut Option<ToolError>) -> ToolError {
    error
        .take()
        .unwrap_or_else(|| ToolError::internal("breaker future polled after completion"))
}

#[cfg(test)]
mod tests {
    use std::future::Ready;

    use toolshield_contract::DefaultClassifier;
    use toolshield_core::ToolResponse;

    use super::{same_key, CallGuard, ResponseFuture, ToolError};

    #[test]
    fn an_admitted_calls_future_is_the_inner_future_and_its_guard() {
        type Inner = Ready<Result<ToolResponse, ToolError>>;
        let inner = std::mem::size_of::<Inner>();
        let guard = std::mem::size_of::<CallGuard>();
        let future = std::mem::size_of::<ResponseFuture<Inner, DefaultClassifier>>();
        assert!(
            future <= inner + guard,
            "{future} bytes for a {inner}-byte inner future and a {guard}-byte guard"
        );
    }

    #[test]
    fn same_key_agrees_with_string_equality_at_every_length() {
        let base = "abcdefghijklmnopqrstuvwxyz";
        for n in 0..=base.len() {
            let a = &base[..n];
            assert!(same_key(a, a), "{a:?}");
            // A difference at each position is seen, and so is another length.
            for i in 0..n {
                let mut b = a.as_bytes().to_vec();
                b[i] ^= 1;
                let b = String::from_utf8(b).unwrap();
                assert!(!same_key(a, &b), "{a:?} vs {b:?}");
            }
            if n > 0 {
                assert!(!same_key(a, &base[..n - 1]));
                assert!(!same_key(&base[..n - 1], a));
            }
        }
        assert!(same_key("é", "é"));
        assert!(!same_key("weather", "weathe\u{0}"));
    }
}
