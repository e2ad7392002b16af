//! The default stack from one [`ShieldConfig`], [`Shield`], around any
//! `Service<ToolRequest>`, and a [`ToolRouter`] dispatching calls by tool name.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use toolshield_breaker::{BreakerLayer, BreakerRegistry};
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
use toolshield_metrics::{MetricsConfig, MetricsLayer, PrometheusExporter};
use toolshield_provenance::ProvenanceLayer;

use crate::collectors::{BreakerMetrics, FallbackMetrics};
use toolshield_retry::RetryLayer;
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use toolshield_validate::{Schema, ValidateLayer};
use tower::util::{BoxCloneSyncService, Either, MapRequestLayer};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

use crate::config::{ShieldConfig, ToolConfig};

/// A shielded tool behind one type: what the [`ToolRouter`] holds.
pub type BoxTool = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

/// The layers of one tool, built and checked once, each holding that tool's policy: a
/// call finds its settings in the stack that wraps its tool, never by name.
#[derive(Clone)]
struct ToolLayers {
    kind: Option<CallKind>,
    validate: Option<ValidateLayer>,
    cache: CacheLayer,
    deadline: Option<DeadlineLayer>,
    idempotency: IdempotencyLayer,
    retry: RetryLayer,
    breaker: BreakerLayer,
    timeout: TimeoutLayer,
}

/// The default stack (see docs/layer-order.md) built from a [`ShieldConfig`], with its shared
/// state: breaker registries, the result cache, the idempotency store, the schemas.
///
/// Cloning is cheap and every clone (and every service it wraps) shares that state.
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
    config: Arc<ShieldConfig>,
    defaults: ToolLayers,
    tools: Arc<BTreeMap<String, ToolLayers>>,
    breakers: BTreeMap<String, BreakerRegistry>,
    cache: CacheLayer,
    idempotency_store: Arc<dyn IdempotencyStore>,
    metrics: MetricsLayer,
    exporter: Option<PrometheusExporter>,
    provenance: ProvenanceLayer,
}

impl fmt::Debug for Shield {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shield")
            .field("enabled", &self.config.enabled)
            .field("tools", &self.config.tools.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The name of the breaker registry shared by every tool on the default breaker settings.
pub const DEFAULT_REGISTRY: &str = "default";

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

        // One store, one single-flight table and one set of counters; each tool's layer
        // adds its own policy.
        let cache = CacheLayer::with_store(CacheConfig::from(&config.defaults.cache), cache_store)
            .map_err(|e| e.prefixed("defaults.cache"))?;

        let default_registry = BreakerRegistry::new(config.defaults.breaker.clone())
            .map_err(|e| e.prefixed("defaults.breaker"))?;
        let mut breakers =
            BTreeMap::from([(DEFAULT_REGISTRY.to_owned(), default_registry.clone())]);

        let build = |tool: &ToolConfig,
                     path: &str,
                     registry: BreakerRegistry|
         -> Result<ToolLayers, ConfigError> {
            let validate = match &tool.schema {
                Some(schema) => Some(ValidateLayer::new(
                    Schema::new(schema.clone())
                        .map_err(|e| e.prefixed(&format!("{path}.schema")))?,
                )),
                None => None,
            };
            Ok(ToolLayers {
                kind: tool.kind,
                validate,
                cache: cache
                    .with_config(CacheConfig::from(&tool.cache))
                    .map_err(|e| e.prefixed(&format!("{path}.cache")))?,
                deadline: DeadlineLayer::from_config(&tool.timeout)
                    .map_err(|e| e.prefixed(&format!("{path}.timeout")))?,
                idempotency: IdempotencyLayer::with_store(
                    tool.idempotency.clone(),
                    idempotency_store.clone(),
                )
                .map_err(|e| e.prefixed(&format!("{path}.idempotency")))?,
                retry: RetryLayer::from_config(&tool.retry)
                    .map_err(|e| e.prefixed(&format!("{path}.retry")))?,
                breaker: BreakerLayer::new(registry),
                timeout: TimeoutLayer::from_config(&tool.timeout)
                    .map_err(|e| e.prefixed(&format!("{path}.timeout")))?,
            })
        };

        let defaults = build(&config.defaults, "defaults", default_registry.clone())?;
        let mut tools = BTreeMap::new();
        for (name, tool) in &config.tools {
            let path = format!("tools.{name}");
            // Tools on the default breaker settings share one registry (one admin view);
            // a tool with its own settings gets its own.
            let registry = if tool.breaker == config.defaults.breaker {
                default_registry.clone()
            } else {
                let r = BreakerRegistry::new(tool.breaker.clone())
                    .map_err(|e| e.prefixed(&format!("{path}.breaker")))?;
                breakers.insert(name.clone(), r.clone());
                r
            };
            tools.insert(name.clone(), build(tool, &path, registry)?);
        }

        // Metrics go to the process's global `metrics` recorder until `with_metrics`
        // points them at an exporter; without a recorder they cost next to nothing.
        let metrics = MetricsLayer::new(config.tools.keys().map(String::as_str))?;

        Ok(Shield {
            config: Arc::new(config),
            defaults,
            tools: Arc::new(tools),
            breakers,
            cache,
            idempotency_store,
            metrics,
            exporter: None,
            provenance: ProvenanceLayer::new(),
        })
    }

    /// Records this shield's metrics into `exporter` (call and attempt metrics, and the
    /// state, transitions and rejections of every breaker registry), for `/metrics`.
    pub fn with_metrics(mut self, exporter: &PrometheusExporter) -> Result<Self, ConfigError> {
        self.metrics = MetricsLayer::build(
            MetricsConfig::with_tools(self.config.tools.keys().map(String::as_str)),
            exporter.target(),
        )?;
        // The `key` label names the configured tools only, as the `tool` label does: a
        // key function (caller, host) or `server__*` names chosen by a model cannot grow
        // the series or put caller ids on an unauthenticated `/metrics`.
        let known: Vec<String> = self.config.tools.keys().cloned().collect();
        for registry in self.breakers.values() {
            exporter.add_collector(
                BreakerMetrics::new(registry.clone(), exporter.target()).known_keys(known.clone()),
            );
        }
        self.exporter = Some(exporter.clone());
        Ok(self)
    }

    /// Uses `provenance` (sources per tool, digest on or off) instead of the default.
    pub fn with_provenance(mut self, provenance: ProvenanceLayer) -> Self {
        self.provenance = provenance;
        self
    }

    /// The configuration this shield was built from.
    pub fn config(&self) -> &ShieldConfig {
        &self.config
    }

    /// The breaker registries: [`DEFAULT_REGISTRY`] shared by every tool on the default
    /// breaker settings, and one per tool with settings of its own.
    pub fn breakers(&self) -> &BTreeMap<String, BreakerRegistry> {
        &self.breakers
    }

    /// The breaker registry that holds `tool`'s breaker.
    pub fn breaker_for(&self, tool: &str) -> &BreakerRegistry {
        self.tools
            .get(tool)
            .unwrap_or(&self.defaults)
            .breaker
            .registry()
    }

    /// Counters and invalidation of the result cache.
    pub fn cache(&self) -> CacheHandle {
        self.cache.handle()
    }

    /// Counters and `forget` of `tool`'s idempotency records.
    pub fn idempotency(&self, tool: &str) -> IdempotencyHandle {
        self.tools
            .get(tool)
            .unwrap_or(&self.defaults)
            .idempotency
            .handle()
    }

    /// The idempotency store every tool shares.
    pub fn idempotency_store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.idempotency_store
    }

    /// The tool names of the configuration (metrics label with these; others are `other`).
    pub fn tool_names(&self) -> impl Iterator<Item = &str> {
        self.config.tools.keys().map(String::as_str)
    }

    /// Wraps `service`, the implementation of `tool`, in the default stack with `tool`'s
    /// settings (the defaults for a tool without a section):
    ///
    /// metrics > provenance > cancel > deadline > validate > cache > idempotency > retry >
    /// attempt metrics > breaker > attempt timeout > catch panic.
    ///
    /// With `enabled = false` (or `TOOLSHIELD_ENABLED=false`) the service is returned
    /// unwrapped: a pass-through.
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
        fallback: Option<FallbackLayer>,
    ) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future: Send>
           + Clone
           + Send
           + Sync
           + 'static
    where
        S: ToolService,
    {
        if !self.config.enabled {
            return Either::Right(service);
        }
        if let (Some(exporter), Some(chain)) = (&self.exporter, &fallback) {
            exporter.add_collector(FallbackMetrics::new(tool, chain.stats(), exporter.target()));
        }
        // The one lookup by name, when the stack is built; calls find their policy in it.
        let l = self.tools.get(tool).unwrap_or(&self.defaults).clone();
        let metrics = self.metrics.for_tool(tool);
        let stack = ServiceBuilder::new()
            .option_layer(l.kind.map(|kind| {
                MapRequestLayer::new(move |mut req: ToolRequest| {
                    req.apply_tool_kind(kind);
                    req
                })
            }))
            .layer(metrics.clone())
            .layer(self.provenance.for_tool(tool))
            .layer(CancelLayer::new())
            .option_layer(l.deadline)
            .option_layer(l.validate)
            .layer(l.cache)
            .layer(l.idempotency)
            .option_layer(fallback)
            .layer(l.retry)
            .layer(metrics.attempt_layer())
            // A caught panic is INTERNAL, which the breaker counts (it is never retried).
            .layer(l.breaker.classifier(CountPanics::new()))
            .layer(l.timeout)
            .layer(catch_panic())
            .service(service);
        Either::Left(stack)
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
    /// A name that is blank, too long, or holds braces or control characters, or one
    /// registered twice, is refused: [`build`](Self::build) lists every such problem.
    pub fn tool<S>(mut self, tool: &str, service: S) -> Self
    where
        S: ToolService,
    {
        if self.accept("tools", tool) {
            let svc = self.shielded(tool, service, None);
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
        fallback: Option<FallbackLayer>,
    ) -> BoxTool {
        // No panic leaves a route: the shield catches the tool's innermost, this catches
        // the rest (a fallback tier, an unshielded or pass-through service).
        let catch = catch_panic();
        match (&self.shield, fallback) {
            (Some(shield), fallback) => {
                BoxTool::new(catch.layer(shield.wrap_with_fallback(name, service, fallback)))
            }
            (None, Some(fallback)) => BoxTool::new(catch.layer(fallback.layer(service))),
            (None, None) => BoxTool::new(catch.layer(service)),
        }
    }

    /// Registers `service` for calls of `tool`, with a fallback chain.
    pub fn tool_with_fallback<S>(mut self, tool: &str, service: S, fallback: FallbackLayer) -> Self
    where
        S: ToolService,
    {
        if self.accept("tools", tool) {
            let svc = self.shielded(tool, service, Some(fallback));
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
        let svc = self.shielded(server, service, None);
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
            }),
        })
    }
}

struct Routes {
    tools: FastHashMap<Arc<str>, BoxTool>,
    servers: FastHashMap<Arc<str>, BoxTool>,
}

impl Routes {
    fn find(&self, tool: &str) -> Option<&BoxTool> {
        self.tools.get(tool).or_else(|| {
            let (server, rest) = tool.split_once("__")?;
            // The rest of the name is chosen by the caller (a model): a name no route could
            // register is not routed.
            if rest.is_empty() || toolshield_core::keys::check_tool_name(tool).is_some() {
                return None;
            }
            self.servers.get(server)
        })
    }
}

/// Dispatches a [`ToolRequest`] by tool name to the service registered for it;
/// `NOT_FOUND` for a tool nobody registered. Always ready: each call drives the readiness
/// of its own route.
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
        let inner: Pin<Box<dyn Future<Output = _> + Send>> = match self.routes.find(req.tool()) {
            Some(svc) => Box::pin(svc.clone().oneshot(req)),
            None => {
                let error = ToolError::new(
                    ErrorKind::NotFound,
                    format!("no tool named `{}` is registered", req.tool()),
                );
                Box::pin(std::future::ready(Err(error)))
            }
        };
        RouterFuture { inner }
    }
}
