//! [`FallbackMetrics`]: hand-overs of a fallback chain, read from its
//! [`FallbackStats`] at scrape time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use toolshield_fallback::FallbackStats;
use toolshield_metrics::metrics::{self, Key, Label};

use toolshield_metrics::Collect;
use toolshield_metrics::MetricsTarget;

/// `tool_fallback_handovers_total{tool,tier}`: calls handed to each fallback tier.
pub const TOOL_FALLBACK_HANDOVERS_TOTAL: &str = "tool_fallback_handovers_total";
/// `tool_fallback_exhausted_total{tool}`: calls where every tier failed.
pub const TOOL_FALLBACK_EXHAUSTED_TOTAL: &str = "tool_fallback_exhausted_total";

/// Exports the hand-over counters of one tool's fallback chain. The `tier` label takes the
/// tier names the application configured, so it stays bounded.
///
/// Register it with [`PrometheusExporter::add_collector`](toolshield_metrics::PrometheusExporter::add_collector);
/// the values are copied from the chain's counters each time it is scraped.
///
/// A [`Shield`](crate::Shield) registers one per tool (not one per wrap), reading every
/// chain wrapped for that tool: the series of a tool wrapped many times (a router rebuilt
/// per agent session) is the sum of its chains' counts, and a chain whose services are
/// all gone is folded into that sum and released.
#[derive(Debug, Clone)]
pub struct FallbackMetrics {
    tool: Arc<str>,
    source: Source,
    target: MetricsTarget,
}

/// What a [`FallbackMetrics`] reads.
#[derive(Debug, Clone)]
enum Source {
    /// One chain's counters.
    One(Arc<FallbackStats>),
    /// Every chain a shield wrapped for one tool.
    Chains(Arc<ToolChains>),
}

/// The counts of one or more chains.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Totals {
    /// Hand-overs by tier name.
    hand_overs: BTreeMap<Arc<str>, u64>,
    exhausted: u64,
}

impl Totals {
    fn add(&mut self, stats: &FallbackStats) {
        for (tier, count) in stats.hand_overs() {
            let cell = self.hand_overs.entry(tier).or_default();
            *cell = cell.saturating_add(count);
        }
        self.exhausted = self.exhausted.saturating_add(stats.exhausted());
    }
}

/// The fallback chains a shield wrapped for one tool, whose counts add up to the tool's
/// series: the chains of live services, and the final counts of those that are gone.
///
/// Bounded by the live wraps: a chain no service holds any more (only this set does) can
/// count nothing else, so its counts are folded into a total and the chain is released,
/// at the next wrap or scrape. A chain wrapped again (a clone of the same layer) is held
/// once.
#[derive(Debug, Default)]
pub(crate) struct ToolChains {
    inner: Mutex<Chains>,
}

#[derive(Debug, Default)]
struct Chains {
    live: Vec<Arc<FallbackStats>>,
    /// The final counts of the chains released.
    retired: Totals,
}

impl Chains {
    /// Folds and releases the chains nothing else holds.
    fn retire(&mut self) {
        let retired = &mut self.retired;
        self.live.retain(|stats| {
            // Only this set holds it: nothing can count on it any more.
            let gone = Arc::strong_count(stats) == 1;
            if gone {
                retired.add(stats);
            }
            !gone
        });
    }
}

impl ToolChains {
    fn lock(&self) -> std::sync::MutexGuard<'_, Chains> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds the counters of a chain wrapped for the tool (once, however often it is
    /// wrapped).
    pub(crate) fn add(&self, stats: Arc<FallbackStats>) {
        let mut chains = self.lock();
        chains.retire();
        if !chains.live.iter().any(|s| Arc::ptr_eq(s, &stats)) {
            chains.live.push(stats);
        }
    }

    fn totals(&self) -> Totals {
        let mut chains = self.lock();
        chains.retire();
        let mut totals = chains.retired.clone();
        for stats in &chains.live {
            totals.add(stats);
        }
        totals
    }
}

impl FallbackMetrics {
    /// Metrics of `tool`'s chain (`FallbackLayer::stats`), registered with `target`.
    pub fn new(
        tool: impl Into<Arc<str>>,
        stats: Arc<FallbackStats>,
        target: MetricsTarget,
    ) -> Self {
        Self::from_source(tool.into(), Source::One(stats), target)
    }

    /// Metrics of every chain a shield wrapped for `tool`.
    pub(crate) fn for_chains(tool: &str, chains: Arc<ToolChains>, target: MetricsTarget) -> Self {
        Self::from_source(Arc::from(tool), Source::Chains(chains), target)
    }

    fn from_source(tool: Arc<str>, source: Source, target: MetricsTarget) -> Self {
        target.describe_counter(
            TOOL_FALLBACK_HANDOVERS_TOTAL,
            Some(metrics::Unit::Count),
            "Calls handed to a fallback tier, by tool and tier.",
        );
        target.describe_counter(
            TOOL_FALLBACK_EXHAUSTED_TOTAL,
            Some(metrics::Unit::Count),
            "Calls where the primary and every fallback tier failed.",
        );
        FallbackMetrics {
            tool,
            source,
            target,
        }
    }
}

impl Collect for FallbackMetrics {
    fn collect(&self) {
        let totals = match &self.source {
            Source::One(stats) => {
                let mut totals = Totals::default();
                totals.add(stats);
                totals
            }
            Source::Chains(chains) => chains.totals(),
        };
        for (tier, count) in totals.hand_overs {
            let k = Key::from_parts(
                TOOL_FALLBACK_HANDOVERS_TOTAL,
                vec![
                    Label::new("tool", self.tool.to_string()),
                    Label::new("tier", tier.to_string()),
                ],
            );
            self.target.counter(&k).absolute(count);
        }
        let k = Key::from_parts(
            TOOL_FALLBACK_EXHAUSTED_TOTAL,
            vec![Label::new("tool", self.tool.to_string())],
        );
        self.target.counter(&k).absolute(totals.exhausted);
    }
}
