//! [`ProvenanceConfig`]: what the layer writes where the tool left a field blank.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use toolshield_core::config::Problems;
use toolshield_core::ConfigError;

/// Configuration of the [`ProvenanceLayer`](crate::ProvenanceLayer).
///
/// ```
/// use toolshield_provenance::ProvenanceConfig;
///
/// let config: ProvenanceConfig = serde_json::from_str(
///     r#"{"source": "agent-tools", "sources": {"weather": "open-meteo.com"}}"#,
/// )?;
/// assert!(config.validate().is_ok());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProvenanceConfig {
    /// The source written on responses whose tool set none. `None`: the tool name.
    pub source: Option<String>,
    /// A source per tool name, taking precedence over `source`.
    pub sources: BTreeMap<String, String>,
    /// Whether to compute `response_digest` (SHA-256 of the canonical output).
    pub digest: bool,
}

impl Default for ProvenanceConfig {
    fn default() -> Self {
        ProvenanceConfig {
            source: None,
            sources: BTreeMap::new(),
            digest: true,
        }
    }
}

impl ProvenanceConfig {
    /// Every problem at once: empty source names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        if let Some(s) = &self.source {
            p.check(!s.trim().is_empty(), "source", "must not be empty");
        }
        for (tool, source) in &self.sources {
            p.check(!tool.trim().is_empty(), "sources", "a tool name is empty");
            p.check(
                !source.trim().is_empty(),
                format!("sources.{tool}"),
                "must not be empty",
            );
        }
        p.into_result()
    }
}
