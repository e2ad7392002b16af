//! [`SharedOpenState`]: the hook through which breakers opened in other processes reject
//! calls here (implemented by `toolshield-redis`).

use std::time::Duration;

/// Open-state learnt from elsewhere (other processes sharing a registry name through
/// Redis, say), given to a registry with
/// [`BreakerRegistry::share_open_state`](crate::BreakerRegistry::share_open_state).
///
/// A closed breaker that is about to admit a call asks [`open_for`](Self::open_for) first;
/// `Some(wait)` rejects the call with `CIRCUIT_OPEN` and `retry_after = wait`, without
/// changing the local state or counts. It sits on the closed-state hot path: it must be a
/// cheap local check (an atomic load, a read of a local map kept up to date by a
/// background task), never I/O. Breakers that are half-open, forced, disabled or in
/// metrics-only mode do not ask.
///
/// Publishing this process's own opens is done from the registry's
/// [`on_event`](crate::BreakerRegistry::on_event) callbacks.
pub trait SharedOpenState: Send + Sync + 'static {
    /// How much longer `key` is open elsewhere, if it is.
    fn open_for(&self, key: &str) -> Option<Duration>;
}
