//! [`BreakerMetrics`]: the breaker metrics (docs/observability.md), read from a
//! [`BreakerRegistry`] at scrape time and rendered with a bounded `key` label.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, RwLock};

use toolshield_breaker::{
    BreakerRegistry, BreakerStatus, CircuitState, EvictedCounts, TransitionCount,
};

use toolshield_metrics::names::{
    CIRCUIT_BREAKER_REJECTIONS_TOTAL, CIRCUIT_BREAKER_STATE, CIRCUIT_BREAKER_TRANSITIONS_TOTAL,
    OTHER_TOOL,
};
use toolshield_metrics::Collect;
use toolshield_metrics::MetricsTarget;
use toolshield_metrics::MAX_TOOLS;

const STATES: usize = CircuitState::ALL.len();

/// Transitions and rejections of one key, or of `other`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Counts {
    rejections: u64,
    /// `[from][to]`, in the order of [`CircuitState::ALL`].
    transitions: [[u64; STATES]; STATES],
}

impl Counts {
    fn cells(&self) -> impl Iterator<Item = (CircuitState, CircuitState, u64)> + '_ {
        CircuitState::ALL.into_iter().flat_map(move |from| {
            CircuitState::ALL
                .into_iter()
                .map(move |to| (from, to, self.transitions[from as usize][to as usize]))
        })
    }

    fn add_transition(&mut self, from: CircuitState, to: CircuitState, n: u64) {
        let cell = &mut self.transitions[from as usize][to as usize];
        *cell = cell.saturating_add(n);
    }

    fn add(&mut self, other: &Counts) {
        self.rejections = self.rejections.saturating_add(other.rejections);
        for (from, to, n) in other.cells() {
            self.add_transition(from, to, n);
        }
    }

    fn saturating_sub(&mut self, other: &Counts) {
        self.rejections = self.rejections.saturating_sub(other.rejections);
        for (from, to, n) in other.cells() {
            let cell = &mut self.transitions[from as usize][to as usize];
            *cell = cell.saturating_sub(n);
        }
    }

    /// Cell by cell, the larger of the two.
    fn raise_to(&mut self, other: &Counts) {
        self.rejections = self.rejections.max(other.rejections);
        for (from, to, n) in other.cells() {
            let cell = &mut self.transitions[from as usize][to as usize];
            *cell = (*cell).max(n);
        }
    }

    fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

/// A key exported under its own name.
#[derive(Debug)]
struct Seen {
    /// The key of the breaker it was last read from: the registry's own `Arc`, so a new
    /// breaker for the same key (the old one evicted) is told apart.
    breaker: Arc<str>,
    /// Its counts as last rendered.
    last: Counts,
}

/// What the collector keeps between scrapes: state for the keys the registry holds (at
/// most), and fixed tables.
#[derive(Debug, Default)]
struct Fold {
    /// Keys exported under their own name.
    named: HashMap<Arc<str>, Seen>,
    /// Keys reported as `other` while their breaker is held, so that a name freed later
    /// never takes a key out of `other` (which would make `other` go down).
    folded: HashSet<Arc<str>>,
    /// Counts last rendered for named keys whose breaker went away: their series ended
    /// with them, so they are not added to `other`.
    gone: Counts,
    /// `other` as last rendered: it never goes down.
    other: Counts,
}

/// One named key of a scrape.
struct Row<'a> {
    key: &'a str,
    state: CircuitState,
    counts: Counts,
}

/// Exports `circuit_breaker_state{key,state}` (1 for the current state, 0 for the other
/// five), `circuit_breaker_transitions_total{key,from,to}` and
/// `circuit_breaker_rejections_total{key}` for the breakers of a registry.
///
/// The values are read from the registry (its status, transition counts and the totals of
/// evicted breakers) at each render, and rendered by the collector itself, after the
/// recorder's families: the series of a key exist exactly while its breaker is held, so an
/// evicted key is gone from the next scrape (a `metrics` recorder cannot remove a series).
/// The breaker's hot path carries no metrics code. Register it with
/// [`PrometheusExporter::add_collector`](toolshield_metrics::PrometheusExporter::add_collector).
///
/// **The `key` label is bounded**, as the `tool` label is. Keys are named when they are
/// *known*: the keys given to [`known_keys`](Self::known_keys), or, without such a list,
/// the first [`max_named_keys`](Self::max_named_keys) keys seen (1,000 by default). A key
/// keeps its name while its breaker is held; a key first seen while every name is taken
/// stays `other` while its breaker is held. Every other breaker is reported as
/// `key="other"`: its state gauge counts the breakers in each state, and its counters
/// hold the counts of those breakers plus those of every breaker the registry no longer
/// holds (evicted, or not kept because the registry was full), so a sum over keys stays
/// true and `other` never goes down. A named key's series ends with its breaker: the
/// counts it had at the last scrape go with it, later ones (rare: the breaker was idle
/// before it was evicted) go to `other`.
///
/// ```
/// use toolshield_breaker::BreakerRegistry;
/// use toolshield::collectors::BreakerMetrics;
/// use toolshield_metrics::local_prometheus;
///
/// let exporter = local_prometheus();
/// let registry = BreakerRegistry::default();
/// exporter.add_collector(
///     BreakerMetrics::new(registry.clone(), exporter.target()).known_keys(["weather"]),
/// );
/// registry.force_open("weather");
/// registry.force_open("server__anything");
/// let text = exporter.render();
/// assert!(text.contains(r#"circuit_breaker_state{key="weather",state="forced_open"} 1"#));
/// assert!(text.contains(r#"circuit_breaker_state{key="other",state="forced_open"} 1"#));
/// assert!(!text.contains("server__anything"));
/// ```
#[derive(Debug, Clone)]
pub struct BreakerMetrics {
    registry: BreakerRegistry,
    // Shared with the shield that made it, which adds the tools it wraps.
    known: Option<Arc<RwLock<HashSet<String>>>>,
    max_named: usize,
    fold: Arc<Mutex<Fold>>,
}

impl BreakerMetrics {
    /// Metrics of `registry`, naming the first 1,000 keys ([`MAX_TOOLS`]).
    ///
    /// `target` is not used: the breaker series are rendered by the collector itself
    /// (see above), whichever recorder the exporter has.
    pub fn new(registry: BreakerRegistry, target: MetricsTarget) -> Self {
        let _ = target;
        BreakerMetrics {
            registry,
            known: None,
            max_named: MAX_TOOLS,
            fold: Arc::default(),
        }
    }

    /// Names only `keys` (the tool names, when breakers are keyed by tool); every other
    /// key is reported as `other`. `other` itself is never a name. Set it before the
    /// first render.
    #[must_use]
    pub fn known_keys<I, K>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        self.known = Some(Arc::new(RwLock::new(
            keys.into_iter().map(Into::into).collect(),
        )));
        self
    }

    /// Names the keys in `keys` at each render: a set the shield keeps (its configured
    /// and wrapped tools), so a tool registered after the collector was made is named.
    #[must_use]
    pub(crate) fn shared_known_keys(mut self, keys: Arc<RwLock<HashSet<String>>>) -> Self {
        self.known = Some(keys);
        self
    }

    /// Without [`known_keys`](Self::known_keys), names at most `n` keys at once (first
    /// seen, first named); 0 reports every key as `other`. Set it before the first
    /// render.
    #[must_use]
    pub fn max_named_keys(mut self, n: usize) -> Self {
        self.max_named = n;
        self
    }

    /// The registry it reads.
    pub fn registry(&self) -> &BreakerRegistry {
        &self.registry
    }

    /// How many keys the collector keeps state for (named, and `other` ones while their
    /// breaker is held): never more than the registry held at the last render.
    pub fn tracked_keys(&self) -> usize {
        let fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        fold.named.len() + fold.folded.len()
    }

    fn may_name(&self, key: &str, folded: &HashSet<Arc<str>>, named: usize) -> bool {
        if key == OTHER_TOOL {
            return false;
        }
        match &self.known {
            Some(known) => known
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains(key),
            None => named < self.max_named && !folded.contains(key),
        }
    }
}

/// The transitions of each key, and the `Arc` of the breaker they were read from.
fn by_key(transitions: &[TransitionCount]) -> HashMap<&str, (&Arc<str>, Counts)> {
    let mut out: HashMap<&str, (&Arc<str>, Counts)> = HashMap::new();
    for t in transitions {
        let entry = out
            .entry(&*t.key)
            .or_insert_with(|| (&t.key, Counts::default()));
        entry.1.add_transition(t.from, t.to, t.count);
    }
    out
}

impl Fold {
    /// Classifies the breakers of one scrape; returns the named rows and, if anything is
    /// reported as `other`, the number of its breakers in each state.
    fn update<'a>(
        &mut self,
        metrics: &BreakerMetrics,
        evicted: &EvictedCounts,
        transitions: &[TransitionCount],
        statuses: &'a [BreakerStatus],
    ) -> (Vec<Row<'a>>, Option<[u64; STATES]>) {
        let transitions = by_key(transitions);
        let mut rows = Vec::new();
        let mut other_live = Counts::default();
        let mut other_states = [0u64; STATES];
        let mut folded_now = 0usize;
        for status in statuses {
            let key = &status.key;
            let mut counts = Counts {
                rejections: status.rejections,
                ..Counts::default()
            };
            // A breaker replaced between the two readings is new: its transitions are
            // read at the next scrape.
            if let Some((breaker, t)) = transitions.get(&**key) {
                if Arc::ptr_eq(breaker, key) {
                    counts.transitions = t.transitions;
                }
            }
            let named = if let Some(seen) = self.named.get_mut(&**key) {
                if !Arc::ptr_eq(&seen.breaker, key) {
                    // The old breaker was evicted: its series ended with what it showed.
                    self.gone.add(&seen.last);
                    seen.breaker = Arc::clone(key);
                }
                seen.last = counts.clone();
                true
            } else if metrics.may_name(key, &self.folded, self.named.len()) {
                self.named.insert(
                    Arc::clone(key),
                    Seen {
                        breaker: Arc::clone(key),
                        last: counts.clone(),
                    },
                );
                true
            } else {
                if metrics.known.is_none() {
                    self.folded.insert(Arc::clone(key));
                }
                false
            };
            if named {
                rows.push(Row {
                    key,
                    state: status.state,
                    counts,
                });
            } else {
                folded_now += 1;
                other_states[status.state as usize] += 1;
                other_live.add(&counts);
            }
        }
        // Keys whose breaker is no longer held.
        let held = |k: &str| statuses.binary_search_by(|s| (*s.key).cmp(k)).is_ok();
        let gone = &mut self.gone;
        self.named.retain(|k, seen| {
            let keep = held(k);
            if !keep {
                gone.add(&seen.last);
            }
            keep
        });
        self.folded.retain(|k| held(k));

        let mut other = other_live;
        let mut retired = Counts {
            rejections: evicted.rejections,
            ..Counts::default()
        };
        for &(from, to, n) in &evicted.transitions {
            retired.add_transition(from, to, n);
        }
        retired.saturating_sub(&self.gone);
        other.add(&retired);
        // A breaker evicted between the readings is missed once: keep `other` monotonic.
        self.other.raise_to(&other);
        let show_other = folded_now > 0 || !self.other.is_zero();
        (rows, show_other.then_some(other_states))
    }
}

impl Collect for BreakerMetrics {
    /// Nothing to do: everything is read at [`render`](Collect::render).
    fn collect(&self) {}

    fn render(&self, out: &mut String) {
        // Evicted totals first, then transitions, then statuses: a breaker evicted in
        // between is missed for one scrape, never counted twice.
        let evicted = self.registry.evicted_counts();
        let transitions = self.registry.transition_counts();
        let statuses = self.registry.status_all();
        let mut fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        let (rows, other_states) = fold.update(self, &evicted, &transitions, &statuses);
        let other = other_states.map(|states| (states, &fold.other));

        let mut family = Family::new(
            out,
            CIRCUIT_BREAKER_STATE,
            "gauge",
            "Circuit breaker state: 1 for the current state, 0 for the others; for key `other`, the number of breakers in each state.",
        );
        for row in &rows {
            for state in CircuitState::ALL {
                family.sample(
                    &[("key", row.key), ("state", state.as_str())],
                    u64::from(state == row.state),
                );
            }
        }
        if let Some((states, _)) = other {
            for state in CircuitState::ALL {
                family.sample(
                    &[("key", OTHER_TOOL), ("state", state.as_str())],
                    states[state as usize],
                );
            }
        }
        family.end();

        let mut family = Family::new(
            out,
            CIRCUIT_BREAKER_TRANSITIONS_TOTAL,
            "counter",
            "Circuit breaker transitions and overrides, by from and to state.",
        );
        let named = rows.iter().map(|r| (r.key, &r.counts));
        for (key, counts) in named.chain(other.map(|(_, c)| (OTHER_TOOL, c))) {
            for (from, to, n) in counts.cells().filter(|c| c.2 > 0) {
                family.sample(
                    &[("key", key), ("from", from.as_str()), ("to", to.as_str())],
                    n,
                );
            }
        }
        family.end();

        let mut family = Family::new(
            out,
            CIRCUIT_BREAKER_REJECTIONS_TOTAL,
            "counter",
            "Calls rejected by an open circuit breaker.",
        );
        let named = rows.iter().map(|r| (r.key, &r.counts));
        for (key, counts) in named.chain(other.map(|(_, c)| (OTHER_TOOL, c))) {
            family.sample(&[("key", key)], counts.rejections);
        }
        family.end();
    }
}

/// One family of the text exposition; written only if it has a sample.
struct Family<'a> {
    out: &'a mut String,
    header: Option<(&'static str, &'static str, &'static str)>,
    name: &'static str,
}

impl<'a> Family<'a> {
    fn new(
        out: &'a mut String,
        name: &'static str,
        kind: &'static str,
        help: &'static str,
    ) -> Self {
        Family {
            out,
            header: Some((name, kind, help)),
            name,
        }
    }

    fn sample(&mut self, labels: &[(&str, &str)], value: u64) {
        if let Some((name, kind, help)) = self.header.take() {
            let _ = writeln!(self.out, "# HELP {name} {help}");
            let _ = writeln!(self.out, "# TYPE {name} {kind}");
        }
        self.out.push_str(self.name);
        self.out.push('{');
        for (i, (name, value)) in labels.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(name);
            self.out.push_str("=\"");
            toolshield_metrics::escape_label_value(self.out, value);
            self.out.push('"');
        }
        let _ = writeln!(self.out, "}} {value}");
    }

    fn end(self) {
        if self.header.is_none() {
            self.out.push('\n');
        }
    }
}
