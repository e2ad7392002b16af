use std::time::Duration;

use toolshield_contract::config::MAX_DURATION;
use toolshield_contract::ConfigError;
use tower_layer::Layer;

use crate::config::TimeoutConfig;
use crate::service::{Deadline, Timeout};

/// Applies a hard timeout to each attempt, and optionally marks slow successes.
///
/// Configuration only; see [`Timeout`] for the behaviour.
#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    attempt: Duration,
    soft: Option<Duration>,
    idle: Option<Duration>,
}

impl TimeoutLayer {
    /// A hard timeout of `attempt` per call of the inner service, no soft threshold.
    ///
    /// An `attempt` longer than [`MAX_DURATION`] (366 days) is clamped to it, so no
    /// deadline computed from it can overflow the clock; a configuration file is stricter
    /// ([`TimeoutConfig::validate`] rejects it). A zero `attempt` is taken as given: only
    /// a call whose future is ready at its first poll succeeds, every other one is a
    /// `TIMEOUT` (a configuration file rejects zero).
    #[must_use]
    pub fn new(attempt: Duration) -> Self {
        TimeoutLayer {
            attempt: attempt.min(MAX_DURATION),
            soft: None,
            idle: None,
        }
    }

    /// Cuts an attempt that reports no progress for `idle`
    /// ([`Progress::report`](toolshield_contract::Progress::report)); each report resets
    /// it, and nothing extends the attempt past the attempt timeout. An `idle` longer than
    /// [`MAX_DURATION`] is clamped to it; one not below the attempt timeout never fires
    /// before it (a configuration file rejects it: [`TimeoutConfig::validate`]).
    #[must_use]
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = Some(idle.min(MAX_DURATION));
        self
    }

    /// Marks a success slower than `soft` as slow ([`SlowCall`](toolshield_contract::SlowCall)).
    /// A `soft` longer than [`MAX_DURATION`] is clamped to it.
    ///
    /// Taken as given where a configuration file is stricter ([`TimeoutConfig::validate`]):
    /// a `soft` not below the attempt timeout marks next to no call (only a success that
    /// ends as the attempt times out: any slower one has timed out), and a zero `soft`
    /// marks every success slow.
    #[must_use]
    pub fn soft_threshold(mut self, soft: Duration) -> Self {
        self.soft = Some(soft.min(MAX_DURATION));
        self
    }

    /// The attempt timeout, soft threshold and idle limit of a validated config.
    pub fn from_config(cfg: &TimeoutConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(TimeoutLayer {
            attempt: cfg.attempt,
            soft: cfg.soft,
            idle: cfg.idle,
        })
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout::new(inner, self.attempt, self.soft).with_idle(self.idle)
    }
}

/// Gives the whole call a deadline, written on the request so the layers inside (retry)
/// can see how much time is left.
///
/// The call's attempt token is cancelled when the deadline cuts the call (the deadline
/// guards it), unless [`attempts_guarded_below`](Self::attempts_guarded_below) says a
/// layer inside does so.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    total: Duration,
    guard: bool,
}

impl DeadlineLayer {
    /// A whole-call budget of `total`.
    ///
    /// A `total` longer than [`MAX_DURATION`] (366 days) is clamped to it; a
    /// configuration file is stricter ([`TimeoutConfig::validate`] rejects it).
    #[must_use]
    pub fn new(total: Duration) -> Self {
        DeadlineLayer {
            total: total.min(MAX_DURATION),
            guard: true,
        }
    }

    /// For a stack in which every attempt runs under an attempt [`TimeoutLayer`] inside
    /// this one (the shield's stack): the timeout cancels its attempt's token when the
    /// deadline drops it unfinished, so the deadline does not guard the token itself,
    /// which saves a clone of the call's tokens (and its drop) per call. Without such a
    /// layer inside, an attempt cut by the deadline would not see its token cancelled.
    #[must_use]
    pub fn attempts_guarded_below(mut self) -> Self {
        self.guard = false;
        self
    }

    /// The total budget of a validated config, or `None` when the config has none.
    pub fn from_config(cfg: &TimeoutConfig) -> Result<Option<Self>, ConfigError> {
        cfg.validate()?;
        Ok(cfg.total.map(DeadlineLayer::new))
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        let deadline = Deadline::new(inner, self.total);
        if self.guard {
            deadline
        } else {
            deadline.unguarded()
        }
    }
}
