//! [`MetricsLayer`] (once per logical call) and [`AttemptMetricsLayer`] (once per
//! attempt), with their [`MetricsConfig`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toolshield_contract::config::Problems;
use toolshield_contract::ConfigError;
use tower_layer::Layer;

use crate::handles::{Shared, ToolNames};
use crate::names::OTHER_TOOL;
use crate::service::{AttemptMetrics, Metrics};
use crate::target::MetricsTarget;

/// Most tool names a layer accepts: the `tool` label stays bounded.
pub const MAX_TOOLS: usize = 1000;

/// Configuration of a [`MetricsLayer`].
///
/// ```
/// use toolshield_metrics::MetricsConfig;
///
/// let config: MetricsConfig = serde_json::from_str(r#"{"tools": ["weather", "search"]}"#)?;
/// assert!(config.validate().is_ok());
/// assert!(config.cache_misses && config.spans);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// The tool names reported as themselves in the `tool` label; every other name is
    /// reported as `other`.
    pub tools: Vec<String>,
    /// Count `tool_cache_misses_total` for read-only calls the cache did not answer.
    /// Turn it off when the stack has no cache layer.
    pub cache_misses: bool,
    /// Open a `tool_execution` span per call and a `tool_attempt` span per attempt.
    pub spans: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            tools: Vec::new(),
            cache_misses: true,
            spans: true,
        }
    }
}

impl MetricsConfig {
    /// A config reporting `tools` by name, everything else as defaults.
    pub fn with_tools<I, T>(tools: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        MetricsConfig {
            tools: tools.into_iter().map(Into::into).collect(),
            ..MetricsConfig::default()
        }
    }

    /// Every problem at once: empty, duplicate or reserved names, too many names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check(
            self.tools.len() <= MAX_TOOLS,
            "tools",
            format_args!("{} names, at most {MAX_TOOLS}", self.tools.len()),
        );
        let mut seen = std::collections::HashSet::new();
        for (i, name) in self.tools.iter().enumerate() {
            let field = format!("tools[{i}]");
            if name.trim().is_empty() {
                p.push(field, "must not be empty");
            } else if name == OTHER_TOOL {
                p.push(field, "`other` is reserved for unregistered tools");
            } else if !seen.insert(name.as_str()) {
                p.push(field, format_args!("`{name}` is listed twice"));
            }
        }
        p.into_result()
    }
}

/// Records the call metrics (docs/observability.md) and the `tool_execution` span once per logical call.
///
/// Place it outermost. For per-attempt metrics (`tool_attempts_total`,
/// `tool_retries_total`) and spans, put [`attempt_layer`](Self::attempt_layer) inside
/// the retry layer. Both share the handles of this layer.
#[derive(Debug, Clone)]
pub struct MetricsLayer {
    shared: Arc<Shared>,
    // The label slot of the one tool this layer counts, resolved when it was made
    // (`for_tool`); `None`: each call's name is looked up (one layer over many tools).
    slot: Option<usize>,
    // Whether this layer's read-only calls that were not hits count as cache misses:
    // `false` over a stack with no cache layer (`without_cache_misses`).
    cache_misses: bool,
}

impl MetricsLayer {
    /// A layer reporting `tools` by name (everything else as `other`), registering with
    /// the global recorder.
    ///
    /// Fails on an empty, duplicate or reserved name.
    pub fn new<I, T>(tools: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self::from_config(MetricsConfig::with_tools(tools))
    }

    /// A layer from `config`, registering with the global recorder.
    pub fn from_config(config: MetricsConfig) -> Result<Self, ConfigError> {
        Self::build(config, MetricsTarget::Global)
    }

    /// A layer from `config` registering with `target` (a local recorder, for instance).
    pub fn build(config: MetricsConfig, target: MetricsTarget) -> Result<Self, ConfigError> {
        config.validate()?;
        let names = config.tools.into_iter().map(Arc::from).collect();
        Ok(MetricsLayer {
            shared: Arc::new(Shared::new(
                ToolNames::new(names),
                target,
                config.cache_misses,
                config.spans,
            )),
            slot: None,
            cache_misses: true,
        })
    }

    /// The same layer for the stack of one tool: every call through it is counted under
    /// `tool`'s label (`other` outside the registered set), resolved now, so no call looks
    /// its name up. The facade builds one per tool, and one per MCP server for all of the
    /// server's tools.
    #[must_use]
    pub fn for_tool(&self, tool: &str) -> Self {
        MetricsLayer {
            shared: Arc::clone(&self.shared),
            slot: Some(self.shared.tools.index(tool)),
            cache_misses: self.cache_misses,
        }
    }

    /// The same layer for a stack with no cache layer: its read-only calls count no
    /// `tool_cache_misses_total`, since no cache was asked (`MetricsConfig::cache_misses`
    /// turns the counter off for every layer at once). The facade builds a tool's stack
    /// with this when the tool has no cache.
    ///
    /// ```
    /// use toolshield_metrics::{MetricsLayer, MetricsTarget, MetricsConfig};
    ///
    /// let config = MetricsConfig::with_tools(["quote"]);
    /// let metrics = MetricsLayer::build(config, MetricsTarget::Global)?;
    /// let uncached = metrics.for_tool("quote").without_cache_misses();
    /// # let _ = uncached;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn without_cache_misses(mut self) -> Self {
        self.cache_misses = false;
        self
    }

    /// The per-attempt layer sharing this layer's handles: place it inside the retry
    /// layer, outside the breaker (see docs/layer-order.md).
    pub fn attempt_layer(&self) -> AttemptMetricsLayer {
        AttemptMetricsLayer {
            shared: Arc::clone(&self.shared),
            slot: self.slot,
        }
    }

    /// The label a tool name is reported under (`other` outside the registered set).
    pub fn tool_label(&self, tool: &str) -> &str {
        self.shared.tools.label(self.shared.tools.index(tool))
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = Metrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Metrics::new(
            inner,
            Arc::clone(&self.shared),
            self.slot,
            self.cache_misses && self.shared.cache_misses,
        )
    }
}

/// Records `tool_attempts_total{tool,outcome}`, `tool_retries_total{tool,code}` and a
/// `tool_attempt` span once per attempt. Made by [`MetricsLayer::attempt_layer`].
#[derive(Debug, Clone)]
pub struct AttemptMetricsLayer {
    shared: Arc<Shared>,
    slot: Option<usize>,
}

impl<S> Layer<S> for AttemptMetricsLayer {
    type Service = AttemptMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AttemptMetrics::new(inner, Arc::clone(&self.shared), self.slot)
    }
}
