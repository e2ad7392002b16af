//! [`ChaosMetrics`]: fault injection, read from a tool's [`ChaosStats`] at scrape time,
//! so injection left on shows on every dashboard.

use std::sync::Arc;

use toolshield_chaos::{ChaosStats, FaultKind};
use toolshield_metrics::metrics::{self, Key, Label};

use toolshield_metrics::Collect;
use toolshield_metrics::MetricsTarget;

/// `toolshield_faults_injected_total{tool,fault}`: faults injected, by tool and fault
/// (`latency`, `error`, `hang`, `in_band`).
pub const TOOLSHIELD_FAULTS_INJECTED_TOTAL: &str = "toolshield_faults_injected_total";
/// `toolshield_fault_injection_enabled{tool}`: 1 while fault injection is on for the tool.
pub const TOOLSHIELD_FAULT_INJECTION_ENABLED: &str = "toolshield_fault_injection_enabled";

/// Exports one tool's fault-injection state. The `tool` label is the configured tool name
/// and `fault` takes four values, so both stay bounded.
///
/// Register it with [`PrometheusExporter::add_collector`](toolshield_metrics::PrometheusExporter::add_collector)
/// for every tool that has a fault-injection config (with
/// [`ChaosStats::disabled`] where the config is off, so the gauge reads 0); the values
/// are copied from the stats each time it is scraped.
#[derive(Debug, Clone)]
pub struct ChaosMetrics {
    stats: Arc<ChaosStats>,
    target: MetricsTarget,
}

impl ChaosMetrics {
    /// Metrics of one tool's fault injection (`ChaosLayer::stats`), registered with
    /// `target`.
    pub fn new(stats: Arc<ChaosStats>, target: MetricsTarget) -> Self {
        target.describe_counter(
            TOOLSHIELD_FAULTS_INJECTED_TOTAL,
            Some(metrics::Unit::Count),
            "Faults injected on purpose, by tool and fault.",
        );
        ChaosMetrics { stats, target }
    }
}

impl Collect for ChaosMetrics {
    fn collect(&self) {
        let tool = self.stats.tool().to_string();
        for fault in FaultKind::ALL {
            let k = Key::from_parts(
                TOOLSHIELD_FAULTS_INJECTED_TOTAL,
                vec![
                    Label::new("tool", tool.clone()),
                    Label::new("fault", fault.as_str()),
                ],
            );
            self.target.counter(&k).absolute(self.stats.injected(fault));
        }
        let k = Key::from_parts(
            TOOLSHIELD_FAULT_INJECTION_ENABLED,
            vec![Label::new("tool", tool)],
        );
        self.target
            .gauge(&k)
            .set(if self.stats.enabled() { 1.0 } else { 0.0 });
    }
}
