//! What every service built by one [`RetryLayer`](crate::RetryLayer) shares.

use std::sync::Arc;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::budget::RetryBudget;

/// What every service built by one layer shares.
pub(crate) struct Shared<P> {
    pub(crate) classifier: P,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) max_attempts: u32,
    pub(crate) rate_limit_backoff: Duration,
    pub(crate) max_retry_after: Duration,
    pub(crate) min_attempt_time: Duration,
    pub(crate) budget: Option<Arc<RetryBudget>>,
}
