//! [`BreakerMetrics`]: the breaker metrics of DESIGN §5, read from a
//! [`BreakerRegistry`] at scrape time.

use metrics::{Key, Label};
use toolshield_breaker::{BreakerRegistry, CircuitState};

use crate::names::{
    CIRCUIT_BREAKER_REJECTIONS_TOTAL, CIRCUIT_BREAKER_STATE, CIRCUIT_BREAKER_TRANSITIONS_TOTAL,
};
use crate::prometheus::Collect;
use crate::target::MetricsTarget;

/// Exports `circuit_breaker_state{key,state}` (1 for the current state, 0 for the other
/// five), `circuit_breaker_transitions_total{key,from,to}` and
/// `circuit_breaker_rejections_total{key}` for every breaker of a registry.
///
/// The values are read from the registry (its status and transition counters) each time
/// [`collect`](Collect::collect) runs, so they are exact at scrape time and the breaker's
/// hot path carries no metrics code. Register it with
/// [`PrometheusExporter::add_collector`](crate::PrometheusExporter::add_collector).
#[derive(Debug, Clone)]
pub struct BreakerMetrics {
    registry: BreakerRegistry,
    target: MetricsTarget,
}

impl BreakerMetrics {
    /// Metrics of `registry`, registered with `target`.
    pub fn new(registry: BreakerRegistry, target: MetricsTarget) -> Self {
        target.describe_gauge(
            CIRCUIT_BREAKER_STATE,
            "Circuit breaker state: 1 for the current state, 0 for the others.",
        );
        target.describe_counter(
            CIRCUIT_BREAKER_TRANSITIONS_TOTAL,
            Some(metrics::Unit::Count),
            "Circuit breaker transitions and overrides, by from and to state.",
        );
        target.describe_counter(
            CIRCUIT_BREAKER_REJECTIONS_TOTAL,
            Some(metrics::Unit::Count),
            "Calls rejected by an open circuit breaker.",
        );
        BreakerMetrics { registry, target }
    }

    /// The registry it reads.
    pub fn registry(&self) -> &BreakerRegistry {
        &self.registry
    }
}

impl Collect for BreakerMetrics {
    fn collect(&self) {
        for status in self.registry.status_all() {
            let key: &str = &status.key;
            for state in CircuitState::ALL {
                let k = Key::from_parts(
                    CIRCUIT_BREAKER_STATE,
                    vec![
                        Label::new("key", key.to_owned()),
                        Label::new("state", state.as_str()),
                    ],
                );
                let value = if state == status.state { 1.0 } else { 0.0 };
                self.target.gauge(&k).set(value);
            }
            let k = Key::from_parts(
                CIRCUIT_BREAKER_REJECTIONS_TOTAL,
                vec![Label::new("key", key.to_owned())],
            );
            self.target.counter(&k).absolute(status.rejections);
        }
        for t in self.registry.transition_counts() {
            let k = Key::from_parts(
                CIRCUIT_BREAKER_TRANSITIONS_TOTAL,
                vec![
                    Label::new("key", t.key.to_string()),
                    Label::new("from", t.from.as_str()),
                    Label::new("to", t.to.as_str()),
                ],
            );
            self.target.counter(&k).absolute(t.count);
        }
    }
}
