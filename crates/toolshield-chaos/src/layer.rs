use std::fmt;
use std::sync::Arc;

use toolshield_contract::ConfigError;
use tower_layer::Layer;

use crate::config::ChaosConfig;
use crate::plan::Plan;
use crate::service::Chaos;
use crate::stats::ChaosStats;

/// Injects faults into calls at configured rates: latency, errors, hangs, in-band
/// failures. For testing how agents and the layers around them cope.
///
/// Configuration only; see [`Chaos`] for the behaviour. Every service the layer builds
/// shares one draw sequence and one [`ChaosStats`]. Building an active layer logs a
/// `warn` line (target `toolshield::chaos`) with the tool, the rates and the seed.
#[derive(Clone)]
pub struct ChaosLayer {
    plan: Arc<Plan>,
    stats: Arc<ChaosStats>,
}

impl ChaosLayer {
    /// A layer injecting what `cfg` describes into the calls of `tool` (the name is for
    /// the startup log and the metric labels). `None` when `cfg` is not
    /// [active](ChaosConfig::is_active): nothing is injected, so no layer is needed.
    pub fn from_config(tool: &str, cfg: &ChaosConfig) -> Result<Option<Self>, ConfigError> {
        cfg.validate()?;
        if !cfg.is_active() {
            return Ok(None);
        }
        Ok(Some(Self::build(tool, cfg)))
    }

    /// A layer injecting what `cfg` describes, even when `enabled` is `false` (for
    /// tests). Out-of-range rates are clamped; [`ChaosConfig::validate`] reports them.
    #[must_use]
    pub fn new(tool: &str, cfg: &ChaosConfig) -> Self {
        Self::build(tool, cfg)
    }

    fn build(tool: &str, cfg: &ChaosConfig) -> Self {
        let seed = cfg.seed.unwrap_or_else(|| fastrand::u64(..));
        let plan = Plan::new(cfg, seed);
        tracing::warn!(
            target: "toolshield::chaos",
            tool,
            seed,
            latency_rate = cfg.latency.map_or(0.0, |l| l.rate),
            error_rate = cfg.error.iter().map(|e| e.rate).sum::<f64>(),
            hang_rate = cfg.hang.map_or(0.0, |h| h.rate),
            in_band_rate = cfg.in_band.map_or(0.0, |b| b.rate),
            "fault injection is ON: calls to this tool will fail, hang or slow down on purpose"
        );
        ChaosLayer {
            plan: Arc::new(plan),
            stats: Arc::new(ChaosStats::new(Arc::from(tool), true)),
        }
    }

    /// The seed of the draws (the configured one, or the random one chosen).
    pub fn seed(&self) -> u64 {
        self.plan.seed()
    }

    /// The counters shared by every service of this layer.
    pub fn stats(&self) -> &Arc<ChaosStats> {
        &self.stats
    }
}

impl fmt::Debug for ChaosLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosLayer")
            .field("plan", &self.plan)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<S> Layer<S> for ChaosLayer {
    type Service = Chaos<S>;

    fn layer(&self, inner: S) -> Chaos<S> {
        Chaos::new(inner, Arc::clone(&self.plan), Arc::clone(&self.stats))
    }
}
