use std::time::Duration;

use toolshield_contract::config::Problems;
use toolshield_contract::{CallKind, ConfigError};

/// The most hedges a configuration may ask for per call: each one is a whole extra call
/// of the tool.
pub const MAX_HEDGES: u32 = 8;

/// Hedging of one tool's calls.
///
/// ```
/// use std::time::Duration;
/// use toolshield_hedge::{DelayConfig, HedgeConfig};
///
/// let cfg: HedgeConfig = serde_json::from_str(
///     r#"{"enabled": true, "delay": {"percentile": 95, "min": "50ms"}, "max_hedges": 2}"#,
/// ).unwrap();
/// assert!(matches!(cfg.delay, DelayConfig::Percentile(ref p) if p.min == Duration::from_millis(50)));
/// assert!(cfg.validate().is_ok());
///
/// let fixed: HedgeConfig = serde_json::from_str(r#"{"enabled": true, "delay": "200ms"}"#).unwrap();
/// assert_eq!(fixed.delay, DelayConfig::Fixed(Duration::from_millis(200)));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct HedgeConfig {
    /// Whether calls are hedged at all. Default `false`.
    pub enabled: bool,
    /// How long an attempt runs before the next one is sent. Default a fixed 1 s.
    pub delay: DelayConfig,
    /// Attempts sent besides the first, at most [`MAX_HEDGES`]. Default 1.
    pub max_hedges: u32,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            enabled: false,
            delay: DelayConfig::Fixed(Duration::from_secs(1)),
            max_hedges: 1,
        }
    }
}

/// When the next attempt is sent: a fixed delay, or a percentile of recent latencies.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(untagged))]
pub enum DelayConfig {
    /// A fixed delay (`delay = "200ms"`).
    Fixed(
        #[cfg_attr(
            feature = "serde",
            serde(with = "toolshield_contract::config::duration")
        )]
        Duration,
    ),
    /// A percentile of the latencies of recent successful calls
    /// (`delay = { percentile = 95, min = "50ms" }`).
    Percentile(PercentileDelay),
}

/// A delay that follows the latency of recent successful calls.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct PercentileDelay {
    /// The percentile, above 0 and below 100 (95 sends a hedge for the slowest 5 %).
    pub percentile: f64,
    /// The shortest delay used, however fast recent calls were. Default 10 ms.
    #[cfg_attr(
        feature = "serde",
        serde(
            default = "default_min",
            with = "toolshield_contract::config::duration"
        )
    )]
    pub min: Duration,
    /// The longest delay used; also the delay until enough latencies are known
    /// ([`MIN_SAMPLES`](crate::MIN_SAMPLES)). Default 5 s.
    #[cfg_attr(
        feature = "serde",
        serde(
            default = "default_max",
            with = "toolshield_contract::config::duration"
        )
    )]
    pub max: Duration,
}

#[cfg(feature = "serde")]
fn default_min() -> Duration {
    PercentileDelay::DEFAULT_MIN
}

#[cfg(feature = "serde")]
fn default_max() -> Duration {
    PercentileDelay::DEFAULT_MAX
}

impl PercentileDelay {
    /// The default `min`: 10 ms.
    pub const DEFAULT_MIN: Duration = Duration::from_millis(10);
    /// The default `max`: 5 s.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(5);
}

impl HedgeConfig {
    /// Every problem with this configuration: a zero or unbounded delay, a percentile
    /// outside (0, 100), `min > max`, `max_hedges` outside 1..=[`MAX_HEDGES`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check(
            (1..=MAX_HEDGES).contains(&self.max_hedges),
            "max_hedges",
            format_args!(
                "must be between 1 and {MAX_HEDGES}, got {}",
                self.max_hedges
            ),
        );
        match &self.delay {
            DelayConfig::Fixed(d) => {
                p.check(!d.is_zero(), "delay", "must be greater than 0");
                p.check_duration(*d, "delay");
            }
            DelayConfig::Percentile(d) => {
                p.check(
                    d.percentile.is_finite() && d.percentile > 0.0 && d.percentile < 100.0,
                    "delay.percentile",
                    format_args!("must be above 0 and below 100, got {}", d.percentile),
                );
                p.check(!d.min.is_zero(), "delay.min", "must be greater than 0");
                p.check_duration(d.min, "delay.min");
                p.check_duration(d.max, "delay.max");
                p.check(
                    d.min <= d.max,
                    "delay.min",
                    format_args!("min {:?} > max {:?}", d.min, d.max),
                );
            }
        }
        p.into_result()
    }

    /// [`validate`](Self::validate), and a problem when hedging is enabled for a tool of
    /// kind `kind` that must not be sent twice: a `Mutating` tool (its side effects would
    /// repeat). An `Idempotent` tool is accepted; only its calls that carry an
    /// idempotency key are hedged.
    pub fn validate_for_kind(&self, kind: CallKind) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.extend("", self.validate());
        p.check(
            !(self.enabled && kind == CallKind::Mutating),
            "enabled",
            "hedging sends a call more than once: a mutating tool must not be hedged",
        );
        p.into_result()
    }
}
