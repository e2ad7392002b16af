//! What a service built by a [`RetryLayer`](crate::RetryLayer) shares with its clones.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::backoff::Backoff;
use crate::budget::RetryBudget;

/// What a service built by the layer shares with its clones and their futures.
pub(crate) struct Shared<P, S> {
    pub(crate) classifier: P,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) max_attempts: u32,
    pub(crate) rate_limit_backoff: Duration,
    pub(crate) max_retry_after: Duration,
    pub(crate) min_attempt_time: Duration,
    pub(crate) budget: Option<Arc<RetryBudget>>,
    /// What a retry calls: a clone of the inner service, taken at the first call that
    /// may be retried. A first attempt calls the caller's ready service itself, so a
    /// call that succeeds first time clones nothing; the lock is taken only to clone
    /// for a retry.
    pub(crate) template: OnceLock<Mutex<S>>,
}

impl<P, S> Shared<P, S> {
    /// Keeps a clone of `service` for retries, once.
    #[inline]
    pub(crate) fn keep_template(&self, service: &S)
    where
        S: Clone,
    {
        self.template.get_or_init(|| Mutex::new(service.clone()));
    }

    /// A new clone of the service for a retry; `None` if no call kept one.
    pub(crate) fn service_for_retry(&self) -> Option<S>
    where
        S: Clone,
    {
        let template = self.template.get()?;
        // A clone that panicked left nothing half-written: the service is still whole.
        let service = template.lock().unwrap_or_else(PoisonError::into_inner);
        Some(service.clone())
    }
}
