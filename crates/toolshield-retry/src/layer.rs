use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use toolshield_contract::config::MAX_DURATION;
use toolshield_contract::{ConfigError, DefaultClassifier};
use tower_layer::Layer;

use crate::backoff::Backoff;
use crate::budget::RetryBudget;
use crate::config::RetryConfig;
use crate::service::Retry;
use crate::shared::Shared;

/// Retries failed calls with backoff, within a budget, never past the deadline.
///
/// Configuration only: the retry budget is shared (through an `Arc`) by every service
/// this layer builds and by their clones.
///
/// ```
/// use toolshield_retry::{RetryConfig, RetryLayer};
///
/// let layer = RetryLayer::from_config(&RetryConfig { max_attempts: 5, ..Default::default() })?;
/// assert_eq!(layer.max_attempts(), 5);
/// # Ok::<(), toolshield_core::ConfigError>(())
/// ```
pub struct RetryLayer<P = DefaultClassifier> {
    classifier: P,
    backoff: Arc<dyn Backoff>,
    max_attempts: u32,
    rate_limit_backoff: Duration,
    max_retry_after: Duration,
    min_attempt_time: Duration,
    budget: Option<Arc<RetryBudget>>,
}

impl RetryLayer {
    /// The defaults ([`RetryLayer::default`]) with `max_attempts` attempts in all, the
    /// first included (at least 1), as tower's layers take their one argument.
    ///
    /// ```
    /// use toolshield_retry::RetryLayer;
    ///
    /// assert_eq!(RetryLayer::new(5).max_attempts(), 5);
    /// ```
    #[must_use]
    pub fn new(max_attempts: u32) -> Self {
        RetryLayer {
            max_attempts: max_attempts.max(1),
            ..RetryLayer::default()
        }
    }

    /// A layer from a configuration, after [`RetryConfig::validate`]: an invalid
    /// configuration is an error listing every problem.
    pub fn from_config(config: &RetryConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::from_valid(config))
    }

    /// A layer from a configuration already validated.
    fn from_valid(config: &RetryConfig) -> Self {
        let budget = config.budget.enabled.then(|| {
            Arc::new(RetryBudget::new(
                config.budget.ratio,
                config.budget.min_per_sec,
                config.budget.burst,
            ))
        });
        RetryLayer {
            classifier: DefaultClassifier,
            backoff: Arc::new(config.backoff),
            max_attempts: config.max_attempts,
            rate_limit_backoff: config.rate_limit_backoff,
            max_retry_after: config.max_retry_after,
            min_attempt_time: config.min_attempt_time,
            budget,
        }
    }
}

impl Default for RetryLayer {
    /// [`RetryConfig::default`]: 3 attempts, exponential backoff from 500 ms capped at
    /// 5 s with full jitter, 30 s after a 429 without `retry_after`, a `retry_after` of
    /// at most 60 s honoured, 100 ms left before the deadline to start a retry, a budget
    /// of 20 % with a floor of 10 retries per second.
    fn default() -> Self {
        Self::from_valid(&RetryConfig::default())
    }
}

impl<P> RetryLayer<P> {
    /// Replaces the classifier that decides what is retried (any
    /// `Fn(&Result<Res, ToolError>) -> Outcome` works), e.g. to retry a response that
    /// failed output validation.
    #[must_use]
    pub fn with_classifier<P2>(self, classifier: P2) -> RetryLayer<P2> {
        RetryLayer {
            classifier,
            backoff: self.backoff,
            max_attempts: self.max_attempts,
            rate_limit_backoff: self.rate_limit_backoff,
            max_retry_after: self.max_retry_after,
            min_attempt_time: self.min_attempt_time,
            budget: self.budget,
        }
    }

    /// Replaces the backoff with a built-in strategy or a custom [`Backoff`].
    ///
    /// Whatever it returns, a wait (like a `retry_after` from the tool) is cut to
    /// [`MAX_DURATION`](toolshield_contract::config::MAX_DURATION), and a retry whose wait
    /// would end past the call's deadline is not started.
    #[must_use]
    pub fn with_backoff(mut self, backoff: impl Backoff + 'static) -> Self {
        self.backoff = Arc::new(backoff);
        self
    }

    /// The longest `retry_after` a failure may ask for and still be retried (default
    /// 60 s). A failure asking for longer ends the call at once with its error, which
    /// keeps its `retry_after`. Clamped to
    /// [`MAX_DURATION`](toolshield_contract::config::MAX_DURATION).
    #[must_use]
    pub fn with_max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max.min(MAX_DURATION);
        self
    }

    /// The least time that must be left before the deadline for a retry to start
    /// (default 100 ms); with less, the last error is returned. Clamped to
    /// [`MAX_DURATION`](toolshield_contract::config::MAX_DURATION).
    #[must_use]
    pub fn with_min_attempt_time(mut self, min: Duration) -> Self {
        self.min_attempt_time = min.min(MAX_DURATION);
        self
    }

    /// Uses `budget` (which other layers may share too) instead of this layer's own.
    #[must_use]
    pub fn with_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Retries without a budget: only the attempt limit bounds them.
    #[must_use]
    pub fn without_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// Attempts in total, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The retry budget, if one is set.
    pub fn budget(&self) -> Option<&Arc<RetryBudget>> {
        self.budget.as_ref()
    }
}

impl<P: Clone> Clone for RetryLayer<P> {
    fn clone(&self) -> Self {
        RetryLayer {
            classifier: self.classifier.clone(),
            backoff: Arc::clone(&self.backoff),
            max_attempts: self.max_attempts,
            rate_limit_backoff: self.rate_limit_backoff,
            max_retry_after: self.max_retry_after,
            min_attempt_time: self.min_attempt_time,
            budget: self.budget.clone(),
        }
    }
}

impl<P> fmt::Debug for RetryLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer")
            .field("max_attempts", &self.max_attempts)
            .field("rate_limit_backoff", &self.rate_limit_backoff)
            .field("max_retry_after", &self.max_retry_after)
            .field("min_attempt_time", &self.min_attempt_time)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl<S, P: Clone> Layer<S> for RetryLayer<P> {
    type Service = Retry<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_shared(
            inner,
            Arc::new(Shared {
                classifier: self.classifier.clone(),
                backoff: Arc::clone(&self.backoff),
                // Never zero at run time, whatever was built by hand.
                max_attempts: self.max_attempts.max(1),
                rate_limit_backoff: self.rate_limit_backoff,
                max_retry_after: self.max_retry_after,
                min_attempt_time: self.min_attempt_time,
                budget: self.budget.clone(),
                template: OnceLock::new(),
            }),
        )
    }
}
