use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use toolshield_contract::config::MAX_DURATION;
use toolshield_contract::ConfigError;
use tower_layer::Layer;

use crate::budget::HedgeBudget;
use crate::config::{DelayConfig, HedgeConfig, MAX_HEDGES};
use crate::histogram::LatencyHistogram;
use crate::service::Hedge;

/// When a hedge is sent.
#[derive(Debug, Clone)]
pub struct HedgeDelay(pub(crate) DelayKind);

#[derive(Debug, Clone)]
pub(crate) enum DelayKind {
    Fixed(Duration),
    Percentile {
        histogram: Arc<LatencyHistogram>,
        min: Duration,
        max: Duration,
    },
}

impl HedgeDelay {
    /// A fixed delay (clamped to 1 µs ..= [`MAX_DURATION`]).
    #[must_use]
    pub fn fixed(delay: Duration) -> Self {
        HedgeDelay(DelayKind::Fixed(
            delay.clamp(Duration::from_micros(1), MAX_DURATION),
        ))
    }

    /// The `percentile`-th percentile of the latencies of recent successful calls, kept
    /// within `min..=max`; `max` until [`MIN_SAMPLES`](crate::MIN_SAMPLES) latencies are
    /// known. `min > max` is read as `min == max`.
    #[must_use]
    pub fn percentile(percentile: f64, min: Duration, max: Duration) -> Self {
        let max = max.min(MAX_DURATION);
        HedgeDelay(DelayKind::Percentile {
            histogram: Arc::new(LatencyHistogram::new(percentile)),
            min: min.clamp(Duration::from_micros(1), max.max(Duration::from_micros(1))),
            max: max.max(Duration::from_micros(1)),
        })
    }

    /// The delay a call starting now gets.
    #[inline]
    pub fn current(&self) -> Duration {
        match &self.0 {
            DelayKind::Fixed(d) => *d,
            DelayKind::Percentile {
                histogram,
                min,
                max,
            } => histogram.current().map_or(*max, |d| d.clamp(*min, *max)),
        }
    }

    /// The latency histogram of a percentile delay.
    pub fn histogram(&self) -> Option<&Arc<LatencyHistogram>> {
        match &self.0 {
            DelayKind::Fixed(_) => None,
            DelayKind::Percentile { histogram, .. } => Some(histogram),
        }
    }
}

/// Counters of one hedging layer, shared by every service it built.
#[derive(Debug, Default)]
pub struct HedgeStats {
    pub(crate) eligible: AtomicU64,
    pub(crate) hedges_sent: AtomicU64,
    pub(crate) hedge_wins: AtomicU64,
    pub(crate) budget_denied: AtomicU64,
}

impl HedgeStats {
    /// Calls that could be hedged (read-only, or idempotent with a key).
    pub fn eligible(&self) -> u64 {
        self.eligible.load(Ordering::Relaxed)
    }

    /// Extra attempts sent.
    pub fn hedges_sent(&self) -> u64 {
        self.hedges_sent.load(Ordering::Relaxed)
    }

    /// Calls answered by a hedge rather than the first attempt.
    pub fn hedge_wins(&self) -> u64 {
        self.hedge_wins.load(Ordering::Relaxed)
    }

    /// Hedges not sent because the budget refused them.
    pub fn budget_denied(&self) -> u64 {
        self.budget_denied.load(Ordering::Relaxed)
    }
}

/// Sends up to `max_hedges` extra attempts of a read-only call when the first is slow;
/// the first success wins and the others are cancelled.
///
/// Configuration only; see [`Hedge`] for the behaviour. The latency histogram, the
/// budget and the stats are shared by every service the layer builds.
#[derive(Clone)]
pub struct HedgeLayer {
    pub(crate) delay: HedgeDelay,
    pub(crate) max_hedges: u32,
    pub(crate) budget: Option<Arc<dyn HedgeBudget>>,
    pub(crate) own_budget: bool,
    pub(crate) stats: Arc<HedgeStats>,
}

impl HedgeLayer {
    /// Hedges after `delay`, at most `max_hedges` extra attempts (clamped to
    /// 1..=[`MAX_HEDGES`]), no budget.
    #[must_use]
    pub fn new(delay: HedgeDelay, max_hedges: u32) -> Self {
        HedgeLayer {
            delay,
            max_hedges: max_hedges.clamp(1, MAX_HEDGES),
            budget: None,
            own_budget: false,
            stats: Arc::new(HedgeStats::default()),
        }
    }

    /// The layer of a validated config, or `None` when hedging is not enabled.
    pub fn from_config(cfg: &HedgeConfig) -> Result<Option<Self>, ConfigError> {
        cfg.validate()?;
        if !cfg.enabled {
            return Ok(None);
        }
        let delay = match &cfg.delay {
            DelayConfig::Fixed(d) => HedgeDelay::fixed(*d),
            DelayConfig::Percentile(p) => HedgeDelay::percentile(p.percentile, p.min, p.max),
        };
        Ok(Some(HedgeLayer::new(delay, cfg.max_hedges)))
    }

    /// Each hedge withdraws one token from `budget`, shared with a retry layer that
    /// feeds it (`RetryLayer::budget()`); no token, no hedge.
    #[must_use]
    pub fn with_budget(mut self, budget: Arc<dyn HedgeBudget>) -> Self {
        self.budget = Some(budget);
        self.own_budget = false;
        self
    }

    /// Like [`with_budget`](Self::with_budget), for a budget this layer owns: every call
    /// deposits into it as well.
    #[must_use]
    pub fn with_own_budget(mut self, budget: Arc<dyn HedgeBudget>) -> Self {
        self.budget = Some(budget);
        self.own_budget = true;
        self
    }

    /// The delay policy (and its histogram).
    pub fn delay(&self) -> &HedgeDelay {
        &self.delay
    }

    /// The counters shared by every service of this layer.
    pub fn stats(&self) -> &Arc<HedgeStats> {
        &self.stats
    }
}

impl fmt::Debug for HedgeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeLayer")
            .field("delay", &self.delay)
            .field("max_hedges", &self.max_hedges)
            .field("budget", &self.budget.is_some())
            .field("own_budget", &self.own_budget)
            .finish()
    }
}

impl<S> Layer<S> for HedgeLayer {
    type Service = Hedge<S>;

    fn layer(&self, inner: S) -> Hedge<S> {
        Hedge::from_layer(inner, self)
    }
}
