use std::time::Duration;

use toolshield_contract::config::Problems;
use toolshield_contract::{ConfigError, ErrorKind};

/// Fault injection for one tool. Off unless `enabled` and a rate above 0.
///
/// Every call draws one number: the faults take consecutive slices of `[0, 1)` in the
/// order latency, each error, hang, in-band failure, so their rates must add up to at
/// most 1 and a call gets at most one fault.
///
/// ```
/// use std::time::Duration;
/// use toolshield_chaos::ChaosConfig;
/// use toolshield_contract::ErrorKind;
///
/// let cfg: ChaosConfig = serde_json::from_str(r#"{
///     "enabled": true, "seed": 7,
///     "latency": {"rate": 0.1, "delay": "2s"},
///     "error": {"rate": 0.05, "kind": "UPSTREAM_UNAVAILABLE"},
///     "hang": {"rate": 0.01}
/// }"#).unwrap();
/// assert_eq!(cfg.error[0].kind, ErrorKind::UpstreamUnavailable);
/// assert_eq!(cfg.latency.unwrap().delay, Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct ChaosConfig {
    /// Whether faults are injected at all. Default `false`.
    pub enabled: bool,
    /// The seed of the draws: the same seed and the same sequence of calls inject the
    /// same faults. Default: a random seed, logged when the layer is built.
    pub seed: Option<u64>,
    /// Delay some calls, then call the tool.
    pub latency: Option<LatencyFault>,
    /// Fail some calls with an error of a chosen kind, without calling the tool: one
    /// entry, or a list of them.
    #[cfg_attr(feature = "serde", serde(deserialize_with = "one_or_many"))]
    pub error: Vec<ErrorFault>,
    /// Never answer some calls, until they are cancelled (or a timeout drops them).
    pub hang: Option<HangFault>,
    /// Answer some calls with a response that carries an in-band failure, without
    /// calling the tool.
    pub in_band: Option<InBandFault>,
}

/// Delays a call by `delay`, then calls the tool.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct LatencyFault {
    /// Share of calls, 0..=1.
    pub rate: f64,
    /// The added delay.
    #[cfg_attr(
        feature = "serde",
        serde(with = "toolshield_contract::config::duration")
    )]
    pub delay: Duration,
}

/// Fails a call with `kind`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct ErrorFault {
    /// Share of calls, 0..=1.
    pub rate: f64,
    /// The error's kind (its code, e.g. `UPSTREAM_UNAVAILABLE`).
    pub kind: ErrorKind,
    /// The wait the error asks for (a `RATE_LIMITED` error's `retry_after`).
    #[cfg_attr(
        feature = "serde",
        serde(default, with = "toolshield_contract::config::duration::option")
    )]
    pub retry_after: Option<Duration>,
}

/// Never answers a call.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct HangFault {
    /// Share of calls, 0..=1.
    pub rate: f64,
}

/// Answers a call with an in-band failure.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct InBandFault {
    /// Share of calls, 0..=1.
    pub rate: f64,
    /// The kind the failure maps to. Default `EXECUTION_FAILED`.
    #[cfg_attr(feature = "serde", serde(default = "execution_failed"))]
    pub kind: ErrorKind,
}

#[cfg(feature = "serde")]
fn execution_failed() -> ErrorKind {
    ErrorKind::ExecutionFailed
}

#[cfg(feature = "serde")]
fn one_or_many<'de, D>(deserializer: D) -> Result<Vec<ErrorFault>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(ErrorFault),
        Many(Vec<ErrorFault>),
    }
    Ok(
        match <OneOrMany as serde::Deserialize>::deserialize(deserializer)? {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        },
    )
}

fn check_rate(p: &mut Problems, rate: f64, field: String) {
    p.check(
        rate.is_finite() && (0.0..=1.0).contains(&rate),
        field,
        format_args!("rate must be between 0 and 1, got {rate}"),
    );
}

impl ChaosConfig {
    /// Every problem with this configuration: a rate outside 0..=1, rates adding up to
    /// more than 1, a zero or unbounded delay or `retry_after`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        if let Some(l) = &self.latency {
            check_rate(&mut p, l.rate, "latency.rate".to_owned());
            p.check(
                !l.delay.is_zero(),
                "latency.delay",
                "must be greater than 0",
            );
            p.check_duration(l.delay, "latency.delay");
        }
        for (i, e) in self.error.iter().enumerate() {
            check_rate(&mut p, e.rate, format!("error[{i}].rate"));
            if let Some(wait) = e.retry_after {
                p.check_duration(wait, format!("error[{i}].retry_after"));
            }
        }
        if let Some(h) = &self.hang {
            check_rate(&mut p, h.rate, "hang.rate".to_owned());
        }
        if let Some(b) = &self.in_band {
            check_rate(&mut p, b.rate, "in_band.rate".to_owned());
        }
        let sum = self.rate_sum();
        // A little slack for decimal fractions that do not add up exactly in binary.
        p.check(
            !sum.is_finite() || sum <= 1.0 + 1e-9,
            "rates",
            format_args!("the rates add up to {sum}, more than 1 (a call gets at most one fault)"),
        );
        p.into_result()
    }

    /// The rates added up: the share of calls that get a fault.
    pub fn rate_sum(&self) -> f64 {
        self.latency.map_or(0.0, |l| l.rate)
            + self.error.iter().map(|e| e.rate).sum::<f64>()
            + self.hang.map_or(0.0, |h| h.rate)
            + self.in_band.map_or(0.0, |b| b.rate)
    }

    /// Whether this configuration injects anything: enabled, with a rate above 0.
    pub fn is_active(&self) -> bool {
        self.enabled && self.rate_sum() > 0.0
    }
}
