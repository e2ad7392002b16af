//! [`ProvenanceLayer`]: configuration only.

use std::sync::Arc;

use toolshield_core::hash::FastHashMap;
use toolshield_core::ConfigError;
use tower_layer::Layer;

use crate::config::ProvenanceConfig;
use crate::service::Provenance;

/// The settings every service of a layer shares.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub(crate) source: Option<Arc<str>>,
    pub(crate) sources: FastHashMap<Box<str>, Arc<str>>,
    pub(crate) digest: bool,
}

impl Settings {
    pub(crate) fn source_for(&self, tool: &str) -> Option<&Arc<str>> {
        if self.sources.is_empty() {
            return self.source.as_ref();
        }
        self.sources.get(tool).or(self.source.as_ref())
    }
}

/// Stamps complete [`Provenance`](toolshield_core::Provenance) on every response and
/// the attempts and duration on every error. See the [crate docs](crate).
#[derive(Debug, Clone)]
pub struct ProvenanceLayer {
    settings: Arc<Settings>,
}

impl Default for ProvenanceLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl ProvenanceLayer {
    /// A layer with the default settings: the source is the tool name, the digest is on.
    pub fn new() -> Self {
        ProvenanceLayer {
            settings: Arc::new(Settings {
                digest: true,
                ..Settings::default()
            }),
        }
    }

    /// A layer from `config` (every problem reported).
    pub fn from_config(config: ProvenanceConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(ProvenanceLayer {
            settings: Arc::new(Settings {
                source: config.source.map(Arc::from),
                sources: config
                    .sources
                    .into_iter()
                    .map(|(k, v)| (k.into_boxed_str(), Arc::from(v)))
                    .collect(),
                digest: config.digest,
            }),
        })
    }

    /// The same layer for the stack of one tool: its source is resolved now, so a call
    /// never looks its tool up (the facade builds one per tool).
    #[must_use]
    pub fn for_tool(&self, tool: &str) -> Self {
        let settings = &self.settings;
        ProvenanceLayer {
            settings: Arc::new(Settings {
                source: settings.source_for(tool).cloned(),
                sources: FastHashMap::default(),
                digest: settings.digest,
            }),
        }
    }

    /// Writes `source` on responses whose tool set none (instead of the tool name).
    pub fn source(mut self, source: impl Into<Arc<str>>) -> Self {
        Arc::make_mut(&mut self.settings).source = Some(source.into());
        self
    }

    /// Writes `source` on responses of `tool` whose tool set none.
    pub fn source_for(mut self, tool: &str, source: impl Into<Arc<str>>) -> Self {
        Arc::make_mut(&mut self.settings)
            .sources
            .insert(tool.into(), source.into());
        self
    }

    /// Turns the `response_digest` on or off (on by default).
    pub fn digest(mut self, on: bool) -> Self {
        Arc::make_mut(&mut self.settings).digest = on;
        self
    }
}

impl<S> Layer<S> for ProvenanceLayer {
    type Service = Provenance<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Provenance::new(inner, Arc::clone(&self.settings))
    }
}
