//! The default stack from one [`ShieldConfig`], [`Shield`], around any
//! `Service<ToolRequest>`, and a [`ToolRouter`] dispatching calls by tool name.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};

use toolshield_breaker::{BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_cache::{CacheConfig, CacheHandle, CacheLayer, CacheStore, InMemoryCacheStore};
use toolshield_cancel::CancelLayer;
use toolshield_core::config::Problems;
use toolshield_core::hash::FastHashMap;
use toolshield_core::panic::{CatchPanicLayer, CountPanics};
use toolshield_core::{
    CallKind, ConfigError, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolService,
};
use toolshield_fallback::FallbackLayer;
use toolshield_idempotency::{
    IdempotencyHandle, IdempotencyLayer, IdempotencyStore, InMemoryIdempotencyStore,
};
use toolshield_metrics::names::OTHER_TOOL;
use toolshield_metrics::{MetricsConfig, MetricsLayer, MetricsTarget, PrometheusExporter};
use toolshield_provenance::{AttemptProvenanceLayer, ProvenanceLayer};

use crate::collectors::{
    BreakerMetrics, BudgetMetrics, BulkheadMetrics, ChaosMetrics, FallbackMetrics, HedgeMetrics,
    RateLimitMetrics, ToolChains,
};
use toolshield_budget::{BudgetLayer, BudgetLedger};
use toolshield_bulkhead::{BulkheadLayer, ConfiguredKey as BulkheadKeyOf};
use toolshield_chaos::ChaosLayer;
use toolshield_hedge::{HedgeBudget, HedgeLayer};
use toolshield_ratelimit::{ConfiguredKey as RateKeyOf, RateLimitLayer};
use toolshield_retry::RetryLayer;
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use toolshield_validate::{Schema, ValidateLayer};
use tower::util::{BoxCloneSyncService, MapRequestLayer};
use tower::{Layer, Service, ServiceBuilder};

use crate::config::{ShieldConfig, ToolConfig};
pub use crate::reload::ReloadSummary;
use crate::reload::{Policies, PolicyCell, Reloading};
use crate::select::{BoxCall, Optional, Select};

/// A shielded tool behind one type: what the [`ToolRouter`] holds.
pub type BoxTool = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

/// The layers of one tool, built and checked once per configuration, each holding that
/// tool's policy: a call finds its settings in the stack that wraps its tool, never by
/// name.
///
/// The seam for a new layer: a field here, built in [`tool_layers`] (reusing the previous
/// generation's layer when its settings did not change, if it keeps state), placed in
/// [`tool_stack`].
#[derive(Clone)]
pub(crate) struct ToolLayers {
    kind: Option<CallKind>,
    validate: Option<ValidateLayer>,
    cache: CacheLayer,
    deadline: Option<DeadlineLayer>,
    idempotency: IdempotencyLayer,
    retry: RetryLayer,
    /// The name of `breaker`'s registry in [`Shield::breakers`].
    registry: String,
    breaker: BreakerLayer,
    timeout: TimeoutLayer,
}

/// What every generation of policies shares and a reload keeps: the stores, the
/// single-flight table, the breaker registries (with their states).
struct Kept {
    /// One store, one single-flight table and one set of counters; each tool's layer adds
    /// its own policy.
    cache: CacheLayer,
    idempotency_store: Arc<dyn IdempotencyStore>,
    breakers: RwLock<BTreeMap<String, BreakerRegistry>>,
    exporter: RwLock<Option<PrometheusExporter>>,
    /// One reload (or `with_metrics`) at a time.
    reload: Mutex<()>,
    /// The call counts of agent runs, shared by every tool (`[runs]`).
    ledger: BudgetLedger,
    /// The flow-control layers of each tool, built when the tool is first wrapped and
    /// shared by every later wrap of the same name: one bulkhead, one rate bucket, one
    /// latency window per tool, exported once.
    flows: Mutex<BTreeMap<String, Flow>>,
    /// The fallback chains wrapped for each tool, exported as one set of series per tool
    /// (one collector, whatever the number of wraps); a chain is held while a service
    /// holds it.
    fallbacks: Mutex<BTreeMap<String, Arc<ToolChains>>>,
    /// The breaker keys the metrics name (`key` label): the configured tools and every
    /// wrapped one, as the `tool` label does. Shared with every breaker collector.
    breaker_keys: Arc<RwLock<HashSet<String>>>,
}

/// The flow-control layers of one wrapped tool, built when it is wrapped: their state
/// (permits in flight, queued calls, a rate bucket, latency samples) belongs to the tool
/// and outlives a reload (docs/reload.md).
#[derive(Clone, Default)]
struct Flow {
    budget: Option<BudgetLayer>,
    rate_limit: Option<RateLimitLayer<RateKeyOf>>,
    hedge: Option<HedgeLayer>,
    bulkhead: Option<BulkheadLayer<BulkheadKeyOf>>,
    faults: Option<ChaosLayer>,
}

/// `Some(layer)`, or `None` after logging why: the configuration was checked at load, so
/// this is a defect, and the call goes on without the layer rather than failing.
fn flow_layer<T>(tool: &str, section: &str, built: Result<T, ConfigError>) -> Option<T> {
    match built {
        Ok(layer) => Some(layer),
        Err(e) => {
            tracing::error!(tool, section, error = %e, "a checked flow-control section could not be built; the tool runs without it");
            None
        }
    }
}

impl Flow {
    fn new(kept: &Kept, tool: &str, cfg: &ToolConfig, retry: &RetryLayer) -> Self {
        let runs_limited =
            cfg.budget.max_calls.is_some() || cfg.budget.cost > 0 || kept.ledger.has_run_limits();
        let hedge = flow_layer(tool, "hedge", HedgeLayer::from_config(&cfg.hedge))
            .flatten()
            .map(|hedge| match retry.budget() {
                // Hedges spend the retry budget: a storm of hedges is a storm of retries.
                Some(budget) => hedge.with_budget(Arc::clone(budget) as Arc<dyn HedgeBudget>),
                None => hedge,
            });
        Flow {
            budget: runs_limited
                .then(|| {
                    flow_layer(
                        tool,
                        "budget",
                        BudgetLayer::from_config(&kept.ledger, tool, &cfg.budget),
                    )
                })
                .flatten(),
            rate_limit: cfg
                .rate_limit
                .as_ref()
                .and_then(|c| flow_layer(tool, "rate_limit", RateLimitLayer::from_config(c))),
            hedge,
            bulkhead: cfg
                .bulkhead
                .as_ref()
                .and_then(|c| flow_layer(tool, "bulkhead", BulkheadLayer::from_config(c))),
            faults: flow_layer(tool, "faults", ChaosLayer::from_config(tool, &cfg.faults))
                .flatten(),
        }
    }

    /// Registers the exporters of this tool's flow-control counters.
    fn export(&self, tool: &str, exporter: &PrometheusExporter) {
        let target = exporter.target();
        if let Some(l) = &self.rate_limit {
            exporter.add_collector(RateLimitMetrics::new(tool, l.stats(), target.clone()));
        }
        if let Some(l) = &self.hedge {
            exporter.add_collector(HedgeMetrics::new(
                tool,
                Arc::clone(l.stats()),
                target.clone(),
            ));
        }
        if let Some(l) = &self.bulkhead {
            exporter.add_collector(BulkheadMetrics::new(tool, l.stats(), target.clone()));
        }
        if let Some(l) = &self.faults {
            exporter.add_collector(ChaosMetrics::new(Arc::clone(l.stats()), target));
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// The default stack (see docs/layer-order.md) built from a [`ShieldConfig`], with its shared
/// state: breaker registries, the result cache, the idempotency store, the schemas.
///
/// Cloning is cheap and every clone (and every service it wraps) shares that state.
/// [`reload`](Self::reload) swaps the settings of every tool at once, for every clone and
/// every service already wrapped (docs/reload.md).
///
/// ```
/// use serde_json::json;
/// use tower::{service_fn, ServiceExt};
/// use toolshield::config::ShieldConfig;
/// use toolshield::shield::Shield;
/// use toolshield::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = ShieldConfig::from_toml_str(r#"
///     [tools.weather]
///     kind = "read_only"
///     cache = { ttl = "5m" }
/// "#)?;
/// let shield = Shield::from_config(cfg)?;
/// let weather = service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!({"temp": 21}))) });
/// let router = shield.router().tool("weather", weather).build()?;
///
/// let req = ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly);
/// let first = router.clone().oneshot(req.clone()).await?;
/// let second = router.oneshot(req).await?;
/// assert!(!first.provenance.cache_hit && second.provenance.cache_hit);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Shield {
    policies: Arc<PolicyCell>,
    kept: Arc<Kept>,
    provenance: ProvenanceLayer,
}

impl fmt::Debug for Shield {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.policies.load();
        f.debug_struct("Shield")
            .field("generation", &p.generation)
            .field("enabled", &p.config.enabled)
            .field("tools", &p.config.tools.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The name of the breaker registry shared by every tool on the default breaker settings.
pub const DEFAULT_REGISTRY: &str = "default";

/// The name of the registry of a tool with breaker settings of its own: the tool's name,
/// except for a tool named [`DEFAULT_REGISTRY`], whose registry is `{default}` (braces
/// are never part of a tool name, so no tool's registry is another's or the shared one).
fn own_registry_name(tool: &str) -> String {
    if tool == DEFAULT_REGISTRY {
        format!("{{{tool}}}")
    } else {
        tool.to_owned()
    }
}

/// Whether the flow-control settings a tool is wrapped with (kept for the life of the
/// shield) differ between two configurations of it.
fn flow_settings_differ(before: &ToolConfig, after: &ToolConfig) -> bool {
    before.bulkhead != after.bulkhead
        || before.rate_limit != after.rate_limit
        || before.budget != after.budget
        || before.hedge != after.hedge
        || before.faults != after.faults
}

/// A generation of policies built from a configuration, not yet published.
struct Built {
    policies: Policies,
    new_registries: BTreeMap<String, BreakerRegistry>,
    breaker_settings_kept: Vec<String>,
}

/// `Some(value)`, or `None` with the error's problems recorded under `path`.
fn collect<T>(p: &mut Problems, path: &str, r: Result<T, ConfigError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            p.extend(path, Err(e));
            None
        }
    }
}

/// Builds the layers of one tool (or of the defaults) from its section. `previous` is the
/// same section's layers and settings in the running generation: layers that keep state
/// (the retry budget, the idempotency counters) and the compiled schema are kept when
/// their settings did not change.
fn tool_layers(
    tool: &ToolConfig,
    path: &str,
    (registry_name, registry): (&str, BreakerRegistry),
    previous: Option<(&ToolLayers, &ToolConfig)>,
    kept: &Kept,
) -> Result<ToolLayers, ConfigError> {
    let mut p = Problems::new();
    let validate = match (&tool.schema, previous) {
        (Some(schema), Some((l, c))) if c.schema.as_ref() == Some(schema) => l.validate.clone(),
        (Some(schema), _) => collect(
            &mut p,
            &format!("{path}.schema"),
            Schema::new(schema.clone()),
        )
        .map(ValidateLayer::new),
        (None, _) => None,
    };
    let cache = collect(
        &mut p,
        &format!("{path}.cache"),
        kept.cache.with_config(CacheConfig::from(&tool.cache)),
    );
    let deadline = collect(
        &mut p,
        &format!("{path}.timeout"),
        DeadlineLayer::from_config(&tool.timeout),
    );
    let idempotency = match previous {
        Some((l, c)) if c.idempotency == tool.idempotency => Some(l.idempotency.clone()),
        _ => collect(
            &mut p,
            &format!("{path}.idempotency"),
            // Every stack the shield builds marks where an attempt reaches the tool
            // (`AttemptProvenanceLayer` right above it, a fallback tier, an injected fault).
            IdempotencyLayer::with_store(tool.idempotency.clone(), kept.idempotency_store.clone())
                .map(IdempotencyLayer::with_attempt_marks),
        ),
    };
    let retry = match previous {
        Some((l, c)) if c.retry == tool.retry => Some(l.retry.clone()),
        _ => collect(
            &mut p,
            &format!("{path}.retry"),
            RetryLayer::from_config(&tool.retry),
        ),
    };
    let timeout = collect(
        &mut p,
        &format!("{path}.timeout"),
        TimeoutLayer::from_config(&tool.timeout),
    );
    p.into_result()?;
    let (Some(cache), Some(deadline), Some(idempotency), Some(retry), Some(timeout)) =
        (cache, deadline, idempotency, retry, timeout)
    else {
        return Err(ConfigError::single(path, "a layer could not be built"));
    };
    Ok(ToolLayers {
        kind: tool.kind,
        validate,
        cache,
        deadline,
        idempotency,
        retry,
        registry: registry_name.to_owned(),
        breaker: BreakerLayer::new(registry),
        timeout,
    })
}

/// Builds every tool's layers from `config`, keeping from `previous` (the running
/// generation) each tool's breaker registry and the layers whose settings did not change.
/// Every problem of every section is reported.
fn build_policies(
    config: &ShieldConfig,
    previous: Option<&Policies>,
    kept: &Kept,
    target: MetricsTarget,
) -> Result<Built, ConfigError> {
    let mut p = Problems::new();
    let registries = read(&kept.breakers).clone();
    let Some(default_registry) = registries.get(DEFAULT_REGISTRY).cloned() else {
        return Err(ConfigError::single(
            "defaults.breaker",
            "no default registry",
        ));
    };
    let mut new_registries = BTreeMap::new();
    let mut breaker_settings_kept = Vec::new();
    if *default_registry.config() != config.defaults.breaker {
        breaker_settings_kept.push("defaults".to_owned());
    }
    let defaults = collect(
        &mut p,
        "",
        tool_layers(
            &config.defaults,
            "defaults",
            (DEFAULT_REGISTRY, default_registry.clone()),
            previous.map(|prev| (&prev.defaults, &prev.config.defaults)),
            kept,
        ),
    );
    let mut tools = BTreeMap::new();
    for (name, tool) in &config.tools {
        let path = format!("tools.{name}");
        let before =
            previous.and_then(|prev| Some((prev.tools.get(name)?, prev.config.tools.get(name)?)));
        // A tool keeps the registry it had, so a breaker open before a reload is still open
        // after it. Otherwise: tools on the default breaker settings share one registry (one
        // admin view); a tool with its own settings gets its own (kept across reloads that
        // remove and add it again).
        let registry = match before {
            Some((l, _)) => (l.registry.clone(), l.breaker.registry().clone()),
            // A tool that ran on the defaults and has a breaker there that is not closed
            // (open, half-open, under an override) stays with it.
            None if tool.breaker == config.defaults.breaker
                || previous.is_some() && default_registry.state(name) != CircuitState::Closed =>
            {
                (DEFAULT_REGISTRY.to_owned(), default_registry.clone())
            }
            None => match registries.get(&own_registry_name(name)) {
                Some(r) => (own_registry_name(name), r.clone()),
                None => match BreakerRegistry::new(tool.breaker.clone()) {
                    Ok(r) => {
                        new_registries.insert(own_registry_name(name), r.clone());
                        (own_registry_name(name), r)
                    }
                    Err(e) => {
                        p.extend(&format!("{path}.breaker"), Err(e));
                        continue;
                    }
                },
            },
        };
        if *registry.1.config() != tool.breaker {
            breaker_settings_kept.push(name.clone());
        }
        let layers = tool_layers(tool, &path, (&registry.0, registry.1), before, kept);
        if let Some(layers) = collect(&mut p, "", layers) {
            tools.insert(name.clone(), layers);
        }
    }
    // The `tool` label names the configured tools; the same names on the same target
    // are the same series, so a reload that keeps a tool keeps its counts.
    let metrics = match previous {
        Some(prev) if prev.config.tools.keys().eq(config.tools.keys()) => {
            Some(prev.metrics.clone())
        }
        _ => collect(
            &mut p,
            "tools",
            MetricsLayer::build(
                MetricsConfig::with_tools(config.tools.keys().map(String::as_str)),
                target.clone(),
            ),
        ),
    };
    p.into_result()?;
    let (Some(defaults), Some(metrics)) = (defaults, metrics) else {
        return Err(ConfigError::single(
            "defaults",
            "a layer could not be built",
        ));
    };
    Ok(Built {
        policies: Policies {
            generation: 0,
            config: Arc::new(config.clone()),
            defaults,
            tools,
            metrics,
            metrics_target: target,
        },
        new_registries,
        breaker_settings_kept,
    })
}

impl Shield {
    /// Builds every layer of every configured tool, on in-memory stores.
    pub fn from_config(config: ShieldConfig) -> Result<Self, ConfigError> {
        Self::with_stores(
            config,
            Arc::new(InMemoryCacheStore::new()),
            Arc::new(InMemoryIdempotencyStore::new()),
        )
    }

    /// Builds every layer on the given stores (Redis, for several processes).
    pub fn with_stores(
        config: ShieldConfig,
        cache_store: Arc<dyn CacheStore>,
        idempotency_store: Arc<dyn IdempotencyStore>,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let cache = CacheLayer::with_store(CacheConfig::from(&config.defaults.cache), cache_store)
            .map_err(|e| e.prefixed("defaults.cache"))?;
        let default_registry = BreakerRegistry::new(config.defaults.breaker.clone())
            .map_err(|e| e.prefixed("defaults.breaker"))?;
        let kept = Kept {
            cache,
            idempotency_store,
            breakers: RwLock::new(BTreeMap::from([(
                DEFAULT_REGISTRY.to_owned(),
                default_registry,
            )])),
            exporter: RwLock::new(None),
            reload: Mutex::new(()),
            ledger: BudgetLedger::from_config(&config.runs).map_err(|e| e.prefixed("runs"))?,
            flows: Mutex::new(BTreeMap::new()),
            fallbacks: Mutex::new(BTreeMap::new()),
            breaker_keys: Arc::new(RwLock::new(config.tools.keys().cloned().collect())),
        };
        // Metrics go to the process's global `metrics` recorder until `with_metrics`
        // points them at an exporter; without a recorder they cost next to nothing.
        let built = build_policies(&config, None, &kept, MetricsTarget::Global)?;
        write(&kept.breakers).extend(built.new_registries);
        Ok(Shield {
            policies: Arc::new(PolicyCell::new(built.policies)),
            kept: Arc::new(kept),
            provenance: ProvenanceLayer::new(),
        })
    }

    /// Records this shield's metrics into `exporter` (call and attempt metrics, and the
    /// state, transitions and rejections of every breaker registry), for `/metrics`.
    ///
    /// It applies to every clone of this shield and every service they wrapped, and to
    /// the registries later reloads create.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the tools' metrics cannot be built, or when this shield (or
    /// a clone of it) already records into an exporter: its collectors are registered
    /// once, since a second set would write every series twice.
    pub fn with_metrics(self, exporter: &PrometheusExporter) -> Result<Self, ConfigError> {
        let _one = self.kept.reload.lock().unwrap_or_else(|e| e.into_inner());
        if read(&self.kept.exporter).is_some() {
            return Err(ConfigError::single(
                "metrics",
                "this shield already records its metrics into an exporter; call with_metrics once",
            ));
        }
        let current = self.policies.load();
        let metrics = MetricsLayer::build(
            MetricsConfig::with_tools(current.config.tools.keys().map(String::as_str)),
            exporter.target(),
        )?;
        // The `key` label names the configured and wrapped tools only, as the `tool` label
        // does: a key function (caller, host) or `server__*` names chosen by a model cannot
        // grow the series or put caller ids on an unauthenticated `/metrics`.
        for registry in read(&self.kept.breakers).values() {
            exporter.add_collector(
                BreakerMetrics::new(registry.clone(), exporter.target())
                    .shared_known_keys(Arc::clone(&self.kept.breaker_keys)),
            );
        }
        exporter.add_collector(BudgetMetrics::new(
            self.kept.ledger.clone(),
            exporter.target(),
        ));
        {
            // Tools wrapped before the exporter was attached. The exporter is set while
            // the tables are locked: a tool wrapped meanwhile is exported here or by its
            // wrap, never by neither.
            let flows = lock(&self.kept.flows);
            let fallbacks = lock(&self.kept.fallbacks);
            for (tool, flow) in flows.iter() {
                flow.export(tool, exporter);
            }
            for (tool, chains) in fallbacks.iter() {
                exporter.add_collector(FallbackMetrics::for_chains(
                    tool,
                    Arc::clone(chains),
                    exporter.target(),
                ));
            }
            *write(&self.kept.exporter) = Some(exporter.clone());
        }
        self.policies.publish(Policies {
            generation: 0,
            config: Arc::clone(&current.config),
            defaults: current.defaults.clone(),
            tools: current.tools.clone(),
            metrics,
            metrics_target: exporter.target(),
        });
        drop(_one);
        Ok(self)
    }

    /// Uses `provenance` (sources per tool, digest on or off) instead of the default, for
    /// the services this shield (not its earlier clones) wraps from now on.
    pub fn with_provenance(mut self, provenance: ProvenanceLayer) -> Self {
        self.provenance = provenance;
        self
    }

    /// Replaces the settings of every tool at once with `config`, checked as a whole
    /// first: on any problem nothing changes and every problem is returned.
    ///
    /// Calls that start after it returns (that reach `poll_ready` after it) run under the
    /// new settings, in every service this shield or its clones wrapped, routers included;
    /// calls in flight finish under the settings they started with. Kept across the
    /// reload: the cache store and its entries, the single-flight table, the idempotency
    /// store and its records, every breaker registry and the state of every breaker (a
    /// tool keeps its registry; a registry keeps the thresholds it was created with, see
    /// [`ReloadSummary::breaker_settings_kept`]), and the retry budget and idempotency
    /// counters of a section whose settings of that layer did not change.
    ///
    /// See docs/reload.md.
    pub fn reload(&self, config: ShieldConfig) -> Result<ReloadSummary, ConfigError> {
        let _one = self.kept.reload.lock().unwrap_or_else(|e| e.into_inner());
        config.validate()?;
        let previous = self.policies.load();
        let exporter = read(&self.kept.exporter).clone();
        let target = exporter
            .as_ref()
            .map_or(MetricsTarget::Global, PrometheusExporter::target);
        let built = build_policies(&config, Some(&previous), &self.kept, target)?;

        let before = &previous.config;
        let mut summary = ReloadSummary {
            enabled: config.enabled,
            added: (config.tools.keys())
                .filter(|t| !before.tools.contains_key(*t))
                .cloned()
                .collect(),
            removed: (before.tools.keys())
                .filter(|t| !config.tools.contains_key(*t))
                .cloned()
                .collect(),
            breaker_settings_kept: built.breaker_settings_kept,
            new_registries: built.new_registries.keys().cloned().collect(),
            ..ReloadSummary::default()
        };
        if before.defaults != config.defaults {
            summary.changed.push("defaults".to_owned());
        }
        summary.changed.extend(
            (config.tools.iter())
                .filter(|(t, c)| before.tools.get(*t).is_some_and(|b| b != *c))
                .map(|(t, _)| t.clone()),
        );

        if let Some(exporter) = &exporter {
            for registry in built.new_registries.values() {
                exporter.add_collector(
                    BreakerMetrics::new(registry.clone(), exporter.target())
                        .shared_known_keys(Arc::clone(&self.kept.breaker_keys)),
                );
            }
        }
        {
            // The new configuration's tools, and every wrapped one (its services live on).
            let wrapped = lock(&self.kept.flows);
            // A wrapped tool keeps the flow-control layers it was wrapped with: a change
            // of their settings is reported, never silently listed as applied.
            summary.flow_settings_kept = (wrapped.keys())
                .filter(|tool| flow_settings_differ(before.tool(tool), config.tool(tool)))
                .cloned()
                .collect();
            *write(&self.kept.breaker_keys) = (config.tools.keys())
                .chain(wrapped.keys())
                .cloned()
                .collect();
        }
        summary.runs_kept = before.runs != config.runs;
        write(&self.kept.breakers).extend(built.new_registries);
        summary.generation = self.policies.publish(built.policies);
        tracing::info!(
            target: "toolshield::reload",
            generation = summary.generation,
            added = ?summary.added,
            removed = ?summary.removed,
            changed = ?summary.changed,
            breaker_settings_kept = ?summary.breaker_settings_kept,
            flow_settings_kept = ?summary.flow_settings_kept,
            runs_kept = summary.runs_kept,
            "configuration reloaded"
        );
        Ok(summary)
    }

    /// The number of the configuration in force: 1 when built, one more per reload (and
    /// per [`with_metrics`](Self::with_metrics)).
    pub fn generation(&self) -> u64 {
        self.policies.generation()
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<ShieldConfig> {
        Arc::clone(&self.policies.load().config)
    }

    /// The breaker registries: [`DEFAULT_REGISTRY`] shared by every tool on the default
    /// breaker settings, and one per tool with settings of its own (including those a
    /// reload created), named after the tool (`{default}` for a tool named `default`).
    pub fn breakers(&self) -> BTreeMap<String, BreakerRegistry> {
        read(&self.kept.breakers).clone()
    }

    /// The breaker registry that holds `tool`'s breaker.
    pub fn breaker_for(&self, tool: &str) -> BreakerRegistry {
        self.policies.load().layers(tool).breaker.registry().clone()
    }

    /// Counters and invalidation of the result cache.
    pub fn cache(&self) -> CacheHandle {
        self.kept.cache.handle()
    }

    /// Counters and `forget` of `tool`'s idempotency records.
    pub fn idempotency(&self, tool: &str) -> IdempotencyHandle {
        self.policies.load().layers(tool).idempotency.handle()
    }

    /// The idempotency store every tool shares.
    pub fn idempotency_store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.kept.idempotency_store
    }

    /// The tool names of the configuration in force. The metrics `tool` label names these
    /// and every tool wrapped by this shield (registered on its routers), configured or
    /// not.
    pub fn tool_names(&self) -> Vec<String> {
        self.policies.load().config.tools.keys().cloned().collect()
    }

    /// Wraps `service`, the implementation of `tool`, in the default stack with `tool`'s
    /// settings (the defaults for a tool without a section):
    ///
    /// the layers in [the default order](https://github.com/toolshield/toolshield/blob/main/docs/layer-order.md).
    ///
    /// With `enabled = false` (or `TOOLSHIELD_ENABLED=false`) calls go to the service
    /// unwrapped: a pass-through. The service follows [`reload`](Self::reload)s.
    pub fn wrap<S>(
        &self,
        tool: &str,
        service: S,
    ) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send>
           + Clone
           + Send
           + Sync
           + 'static
    where
        S: ToolService,
    {
        self.wrap_with_fallback(tool, service, None)
    }

    /// [`wrap`](Self::wrap), with a fallback chain between idempotency and retry: its
    /// tiers take over when the primary's breaker is open or its retries are exhausted.
    pub fn wrap_with_fallback<S>(
        &self,
        tool: &str,
        service: S,
        fallback: Option<FallbackLayer<ToolRequest, ToolResponse>>,
    ) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send>
           + Clone
           + Send
           + Sync
           + 'static
    where
        S: ToolService,
    {
        self.stack_for(tool, service, fallback, BreakerKey::Tool)
    }

    /// The stack of `wrap_with_fallback`; `key` says whether its calls all have the
    /// breaker key `tool` (a tool's own stack, whose breaker is pinned when built) or one
    /// per tool behind it (an MCP-style server's stack: nothing to pin).
    fn stack_for<S>(
        &self,
        tool: &str,
        service: S,
        fallback: Option<FallbackLayer<ToolRequest, ToolResponse>>,
        key: BreakerKey,
    ) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send>
           + Clone
           + Send
           + Sync
           + 'static
    where
        S: ToolService,
    {
        let flow = self.flow(tool);
        if let Some(chain) = &fallback {
            self.track_fallback(tool, chain.stats());
        }
        let tool: Arc<str> = Arc::from(tool);
        let provenance = self.provenance.clone();
        // The stack is built from the generation in force, and again (once) for each new
        // generation; calls find their policy in the stack, never by name.
        Reloading::new(Arc::clone(&self.policies), move |p: &Policies| {
            tool_stack(
                p,
                &tool,
                key,
                &provenance,
                fallback.clone(),
                &flow,
                service.clone(),
            )
        })
    }

    /// Adds a chain wrapped for `tool` to the tool's set: one collector per tool,
    /// registered with the set, reads every chain of every wrap of it.
    fn track_fallback(&self, tool: &str, stats: Arc<toolshield_fallback::FallbackStats>) {
        let mut fallbacks = lock(&self.kept.fallbacks);
        if let Some(chains) = fallbacks.get(tool) {
            chains.add(stats);
            return;
        }
        let chains = Arc::new(ToolChains::default());
        chains.add(stats);
        if let Some(exporter) = read(&self.kept.exporter).as_ref() {
            exporter.add_collector(FallbackMetrics::for_chains(
                tool,
                Arc::clone(&chains),
                exporter.target(),
            ));
        }
        fallbacks.insert(tool.to_owned(), chains);
    }

    /// The flow-control layers of `tool`: built (and exported) at its first wrap, the
    /// same ones for every later wrap, so a limit per tool holds across all of them.
    fn flow(&self, tool: &str) -> Flow {
        let mut flows = lock(&self.kept.flows);
        if let Some(flow) = flows.get(tool) {
            return flow.clone();
        }
        let current = self.policies.load();
        let flow = Flow::new(
            &self.kept,
            tool,
            current.config.tool(tool),
            &current.layers(tool).retry,
        );
        if let Some(exporter) = read(&self.kept.exporter).as_ref() {
            flow.export(tool, exporter);
        }
        flows.insert(tool.to_owned(), flow.clone());
        if tool != OTHER_TOOL {
            write(&self.kept.breaker_keys).insert(tool.to_owned());
        }
        flow
    }

    /// Starts a router whose tools are wrapped by this shield.
    pub fn router(&self) -> RouterBuilder {
        RouterBuilder {
            shield: Some(self.clone()),
            tools: FastHashMap::default(),
            servers: FastHashMap::default(),
            problems: Problems::new(),
        }
    }
}

/// Which breaker keys the calls through a stack have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BreakerKey {
    /// The stack's own tool name, for every call: its breaker is pinned.
    Tool,
    /// The full name of each tool behind an MCP-style server (`server__tool`).
    PerCall,
}

/// One tool's stack from one generation of policies, in the default order.
fn tool_stack<S: ToolService>(
    p: &Policies,
    tool: &str,
    key: BreakerKey,
    provenance: &ProvenanceLayer,
    fallback: Option<FallbackLayer<ToolRequest, ToolResponse>>,
    flow: &Flow,
    service: S,
) -> Select<
    impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static,
    S,
> {
    if !p.config.enabled {
        return Select::B(service);
    }
    let l = p.layers(tool).clone();
    let metrics = tool_metrics(p, tool);
    let pin = (key == BreakerKey::Tool).then_some(tool);
    let attempt = attempt_stack(&l, pin, &metrics, flow, service);
    let retried = ServiceBuilder::new()
        // Boxed once per call: the layers above move a pointer instead of the retry
        // future (which holds the attempt's future and a copy of the request); measured
        // against boxing each attempt, both, and neither (docs/benchmarks.md).
        .layer(tower::layer::layer_fn(BoxCall))
        .layer(l.retry.clone())
        .service(attempt);
    // A tool without fallback tiers gets no fallback layer in its type, not one switched
    // off: an absent optional layer still sizes its future for the present one (the
    // fallback's holds a copy of the request, 232 bytes), and every layer above would
    // move those bytes on each call.
    //
    // Without tiers every attempt runs under the attempt timeout, which cancels the
    // attempt's token when the call deadline drops it: the deadline need not guard the
    // token as well. A tier runs outside the attempt timeout, so with tiers it does.
    let stack = match fallback {
        None => Select::B(call_stack(
            &l,
            l.deadline.map(DeadlineLayer::attempts_guarded_below),
            &metrics,
            tool,
            provenance,
            flow,
            retried,
        )),
        Some(fallback) => Select::A(call_stack(
            &l,
            l.deadline,
            &metrics,
            tool,
            provenance,
            flow,
            fallback.layer(retried),
        )),
    };
    Select::A(stack)
}

/// The layers above retry, around `inner` (retry, or fallback around retry), with the
/// call `deadline`.
fn call_stack<S>(
    l: &ToolLayers,
    deadline: Option<DeadlineLayer>,
    metrics: &MetricsLayer,
    tool: &str,
    provenance: &ProvenanceLayer,
    flow: &Flow,
    inner: S,
) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send>
       + Clone
       + Send
       + Sync
       + 'static
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static,
{
    // A cache with a zero TTL passes every call through: left out of the stack, it
    // costs no reference count per clone of the stack and nothing per call. Without
    // one, no call of the tool is a cache miss.
    let cache = (!l.cache.config().ttl.is_zero()).then(|| l.cache.clone());
    let metrics = if cache.is_some() {
        metrics.clone()
    } else {
        metrics.clone().without_cache_misses()
    };
    ServiceBuilder::new()
        .layer(Optional(l.kind.map(|kind| {
            MapRequestLayer::new(move |mut req: ToolRequest| {
                req.apply_tool_kind(kind);
                req
            })
        })))
        .layer(metrics)
        .layer(provenance.for_tool(tool))
        .layer(CancelLayer::new())
        .layer(Optional(deadline))
        .layer(Optional(flow.budget.clone()))
        .layer(Optional(l.validate.clone()))
        .layer(Optional(cache))
        .layer(l.idempotency.clone())
        .service(inner)
}

/// The layers below retry: one attempt.
///
/// A tool with no flow-control layer below retry (the common case) gets them left out
/// of its type, not merely switched off: an absent optional layer still sizes its
/// future for the present one (the hedge's alone is several hundred bytes), and the
/// retry future, boxed once per call, then outgrows the allocator's small-size caches.
/// A tool with any of them pays for a type-erased attempt stack instead: one
/// allocation for each attempt's future, and one for each clone of the stack (the
/// caller's clone of the whole stack, and a retried call's clone for its retries).
fn attempt_stack<S: ToolService>(
    l: &ToolLayers,
    pin: Option<&str>,
    metrics: &MetricsLayer,
    flow: &Flow,
    service: S,
) -> Select<
    BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>,
    impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static,
> {
    // A caught panic is INTERNAL, which the breaker counts (it is never retried). A
    // tool's own stack resolves its breaker here, once, not on every call.
    let breaker = l.breaker.clone().classifier(CountPanics::new());
    let breaker = match pin {
        // The stack starts with its tool's breaker in hand (`PinnedBreakerLayer`).
        Some(key) => Select::A(breaker.pin_key(key)),
        None => Select::B(breaker),
    };
    if flow.hedge.is_none()
        && flow.rate_limit.is_none()
        && flow.bulkhead.is_none()
        && flow.faults.is_none()
    {
        return Select::B(
            ServiceBuilder::new()
                .layer(metrics.attempt_layer())
                .layer(breaker)
                .layer(l.timeout)
                .layer(AttemptProvenanceLayer::new())
                .layer(catch_panic())
                .service(service),
        );
    }
    Select::A(BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(Optional(flow.hedge.clone()))
            .layer(metrics.attempt_layer())
            .layer(Optional(flow.rate_limit.clone()))
            .layer(breaker)
            .layer(Optional(flow.bulkhead.clone()))
            .layer(l.timeout)
            .layer(Optional(flow.faults.clone()))
            .layer(AttemptProvenanceLayer::new())
            .layer(catch_panic())
            .service(service),
    ))
}

/// The metrics layer of `tool`'s stack. A tool is known by name when it is configured
/// or when it is wrapped (registered on a router): its stack was built for it, so its
/// name is chosen by code, not by a caller, and the `tool` label stays bounded by the
/// routes. The same name on the same target is the same series, so counts carry across
/// the rebuilds of a reload.
fn tool_metrics(p: &Policies, tool: &str) -> MetricsLayer {
    if p.metrics.tool_label(tool) != OTHER_TOOL {
        return p.metrics.for_tool(tool);
    }
    // A name the metrics layer refuses (`other`, blank) stays `other`.
    MetricsLayer::build(MetricsConfig::with_tools([tool]), p.metrics_target.clone())
        .map_or_else(|_| p.metrics.for_tool(tool), |m| m.for_tool(tool))
}

/// Catches a tool's panic: the caller gets `INTERNAL`, the text goes to the log.
fn catch_panic() -> CatchPanicLayer<impl toolshield_core::panic::OnPanic + Send + Sync + 'static> {
    CatchPanicLayer::new().on_panic(|text: &str| {
        // Inside the call's span, which names the tool; never in the error itself.
        tracing::error!(
            panic = text,
            "a tool panicked: the call fails with INTERNAL"
        );
    })
}

/// Builds a [`ToolRouter`].
pub struct RouterBuilder {
    shield: Option<Shield>,
    tools: FastHashMap<Arc<str>, BoxTool>,
    servers: FastHashMap<Arc<str>, BoxTool>,
    /// Names refused at registration, reported by [`build`](Self::build).
    problems: Problems,
}

impl fmt::Debug for RouterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouterBuilder")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl RouterBuilder {
    /// A router whose services are used as given (no shield).
    pub fn unshielded() -> Self {
        RouterBuilder {
            shield: None,
            tools: FastHashMap::default(),
            servers: FastHashMap::default(),
            problems: Problems::new(),
        }
    }

    /// Registers `service` for calls of `tool`, behind the shield with `tool`'s settings.
    ///
    /// A name that is blank, too long, reserved (`other`, `defaults`), or holds braces or
    /// control characters, or one registered twice, is refused: [`build`](Self::build)
    /// lists every such problem.
    pub fn tool<S>(mut self, tool: &str, service: S) -> Self
    where
        S: ToolService,
    {
        if self.accept("tools", tool) {
            let svc = self.shielded(tool, service, None, BreakerKey::Tool);
            self.tools.insert(Arc::from(tool), svc);
        }
        self
    }

    /// Whether `name` may be registered as a route; records why not.
    fn accept(&mut self, what: &str, name: &str) -> bool {
        if let Some(why) = toolshield_core::keys::check_tool_name(name) {
            self.problems.push(what, format_args!("{name:?}: {why}"));
            return false;
        }
        // A route under a reserved name would share the metrics series of unregistered
        // tools (`other`) or the defaults' entries of a reload summary (`defaults`).
        if let Some(why) = crate::config::reserved_name(name) {
            self.problems.push(what, format_args!("{name:?}: {why}"));
            return false;
        }
        if what == "servers" && name.contains("__") {
            self.problems.push(
                what,
                format_args!("{name:?}: a server name must not contain `__` (it separates the server from its tools)"),
            );
            return false;
        }
        if self.tools.contains_key(name) && what == "tools"
            || self.servers.contains_key(name) && what == "servers"
        {
            self.problems
                .push(what, format_args!("{name:?} is registered twice"));
            return false;
        }
        true
    }

    /// `service` behind the shield with `name`'s settings (as given without a shield).
    fn shielded<S: ToolService>(
        &self,
        name: &str,
        service: S,
        fallback: Option<FallbackLayer<ToolRequest, ToolResponse>>,
        key: BreakerKey,
    ) -> BoxTool {
        // No panic leaves a route: the shield catches the tool's innermost, this catches
        // the rest (a fallback tier, an unshielded or pass-through service).
        let catch = catch_panic();
        match (&self.shield, fallback) {
            (Some(shield), fallback) => {
                BoxTool::new(catch.layer(shield.stack_for(name, service, fallback, key)))
            }
            (None, Some(fallback)) => BoxTool::new(catch.layer(fallback.layer(service))),
            (None, None) => BoxTool::new(catch.layer(service)),
        }
    }

    /// Registers `service` for calls of `tool`, with a fallback chain.
    pub fn tool_with_fallback<S>(
        mut self,
        tool: &str,
        service: S,
        fallback: FallbackLayer<ToolRequest, ToolResponse>,
    ) -> Self
    where
        S: ToolService,
    {
        if self.accept("tools", tool) {
            let svc = self.shielded(tool, service, Some(fallback), BreakerKey::Tool);
            self.tools.insert(Arc::from(tool), svc);
        }
        self
    }

    /// Registers an MCP-style server: every call named `{server}__{tool}` that has no
    /// route of its own goes to `service` (with its full name), behind a stack built with
    /// the settings of the section named `server`: kind, timeouts, retry, breaker
    /// settings, idempotency, cache policy and schema, and the metrics `tool` label is
    /// `server`. Keys stay per tool: breakers, cache entries and idempotency records use
    /// the full tool name, so one failing tool does not open the breaker of its siblings.
    pub fn server<S>(mut self, server: &str, service: S) -> Self
    where
        S: ToolService,
    {
        if !self.accept("servers", server) {
            return self;
        }
        // The stack is built with the server's section: every tool behind it gets the
        // server's policy by construction.
        let svc = self.shielded(server, service, None, BreakerKey::PerCall);
        self.servers.insert(Arc::from(server), svc);
        self
    }

    /// The router, or every name refused at registration.
    pub fn build(self) -> Result<ToolRouter, ConfigError> {
        self.problems.into_result()?;
        Ok(ToolRouter {
            routes: Arc::new(Routes {
                tools: self.tools,
                servers: self.servers,
                shield: self.shield,
            }),
        })
    }
}

struct Routes {
    tools: FastHashMap<Arc<str>, BoxTool>,
    servers: FastHashMap<Arc<str>, BoxTool>,
    /// The shield the routes were wrapped by: its `timeout.total` of a route bounds a
    /// call's wait for that route's readiness.
    shield: Option<Shield>,
}

impl Routes {
    fn find<'a>(&'a self, tool: &'a str) -> Option<&'a BoxTool> {
        self.find_route(tool).map(|(_, svc)| svc)
    }

    /// The route of `tool` and the name of its section (the tool's, or its server's).
    fn find_route<'a>(&'a self, tool: &'a str) -> Option<(&'a str, &'a BoxTool)> {
        if let Some(svc) = self.tools.get(tool) {
            return Some((tool, svc));
        }
        let (server, rest) = tool.split_once("__")?;
        // The rest of the name is chosen by the caller (a model): a name no route could
        // register is not routed.
        if rest.is_empty() || toolshield_core::keys::check_tool_name(tool).is_some() {
            return None;
        }
        self.servers.get(server).map(|svc| (server, svc))
    }

    /// The whole-call budget of the route of `tool` when the routes are shielded and on.
    fn total(&self, tool: &str) -> Option<std::time::Duration> {
        let config = self.shield.as_ref()?.config();
        if !config.enabled {
            return None;
        }
        let (name, _) = self.find_route(tool)?;
        config.tool(name).timeout.total
    }
}

/// Waits until `svc` is ready to take `req`, or until the call's token is cancelled
/// (`CANCELLED`) or its deadline passes (`TIMEOUT`): the router is always ready itself,
/// so a busy route's wait belongs to the call and ends when the call does. The route's
/// whole-call budget (`routes`' `timeout.total` for the tool) is written on the request
/// as its deadline (an earlier one is kept) the first time the route is not ready, so
/// the wait counts against it.
async fn route_ready(
    svc: &mut BoxTool,
    req: &mut ToolRequest,
    routes: &Routes,
) -> Result<(), ToolError> {
    let first = std::future::poll_fn(|cx| Poll::Ready(svc.poll_ready(cx))).await;
    if let Poll::Ready(ready) = first {
        return ready;
    }
    if let Some(total) = routes.total(req.tool()) {
        let own = toolshield_core::config::deadline_after(toolshield_core::time::now(), total);
        if req.deadline_at().is_none_or(|at| own < at) {
            req.set_deadline(own);
        }
    }
    let token = req.call_token().clone();
    let cancelled = token.cancelled();
    let expired = async {
        match req.deadline_at() {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    let mut cancelled = std::pin::pin!(cancelled);
    let mut expired = std::pin::pin!(expired);
    std::future::poll_fn(|cx| {
        if cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(ToolError::cancelled(
                "cancelled while waiting for the tool to be ready",
            )));
        }
        if let Poll::Ready(ready) = svc.poll_ready(cx) {
            return Poll::Ready(ready);
        }
        if expired.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(ToolError::timeout(
                "deadline passed while waiting for the tool to be ready",
            )));
        }
        Poll::Pending
    })
    .await
}

/// Dispatches a [`ToolRequest`] by tool name to the service registered for it;
/// `NOT_FOUND` for a tool nobody registered. Always ready: each call drives the readiness
/// of its own route, and stops waiting for it when the call's token is cancelled
/// (`CANCELLED`) or its deadline passes (`TIMEOUT`; the route's `timeout.total`, when set,
/// counts from the call).
#[derive(Clone)]
pub struct ToolRouter {
    routes: Arc<Routes>,
}

impl fmt::Debug for ToolRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tools: Vec<_> = self.routes.tools.keys().collect();
        tools.sort();
        f.debug_struct("ToolRouter")
            .field("tools", &tools)
            .finish_non_exhaustive()
    }
}

impl ToolRouter {
    /// Whether a call of `tool` has somewhere to go.
    pub fn has_route(&self, tool: &str) -> bool {
        self.routes.find(tool).is_some()
    }
}

/// The future of [`ToolRouter`].
pub struct RouterFuture {
    inner: Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>,
}

impl fmt::Debug for RouterFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouterFuture").finish_non_exhaustive()
    }
}

impl Future for RouterFuture {
    type Output = Result<ToolResponse, ToolError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl Service<ToolRequest> for ToolRouter {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = RouterFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> RouterFuture {
        let inner: Pin<Box<dyn Future<Output = _> + Send>> = match self
            .routes
            .find_route(req.tool())
        {
            Some((_, svc)) => {
                let mut svc = svc.clone();
                let routes = Arc::clone(&self.routes);
                let mut req = req;
                Box::pin(async move {
                    route_ready(&mut svc, &mut req, &routes).await?;
                    svc.call(req).await
                })
            }
            None => {
                // The name is the caller's (a model's): on one line and cut, as every
                // text that reaches a log or the model.
                let name =
                    toolshield_core::printable(req.tool(), toolshield_core::MAX_TOOL_NAME_SHOWN);
                let error = ToolError::new(
                    ErrorKind::NotFound,
                    format!("no tool named `{name}` is registered"),
                );
                Box::pin(std::future::ready(Err(error)))
            }
        };
        RouterFuture { inner }
    }
}
