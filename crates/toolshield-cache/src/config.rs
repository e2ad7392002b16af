//! Configuration of the cache layer.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolshield_core::config::{duration, ConfigError, Problems};

/// The cache settings of one tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolCacheConfig {
    /// How long a result is fresh; zero turns caching off for the tool.
    #[serde(with = "duration")]
    pub ttl: Duration,
    /// The stale-if-error grace for the tool (else the layer's).
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub stale_if_error: Option<Duration>,
    /// Results are per user: namespace the key by caller id (else the layer's setting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_user: Option<bool>,
}

/// Configuration of the cache layer. Caching is off (TTL 0) unless a TTL is set, for
/// every tool (`default_ttl`) or per tool (`tools`).
///
/// ```
/// use std::time::Duration;
/// use toolshield_cache::CacheConfig;
///
/// let cfg: CacheConfig = serde_json::from_str(r#"{
///     "stale_if_error": "5m",
///     "tools": {"weather": {"ttl": "10m"}, "profile": {"ttl": "1m", "per_user": true}}
/// }"#).unwrap();
/// cfg.validate().unwrap();
/// assert_eq!(cfg.policy_for("weather").ttl, Duration::from_secs(600));
/// assert!(cfg.policy_for("profile").per_user);
/// assert!(cfg.policy_for("other").ttl.is_zero());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// The TTL of tools without their own; zero (the default) means off.
    #[serde(with = "duration")]
    pub default_ttl: Duration,
    /// How long past its TTL an entry may still be served, marked `stale`, when the tool
    /// fails or its circuit is open; zero (the default) means off.
    #[serde(with = "duration")]
    pub stale_if_error: Duration,
    /// Namespace every key by caller id (else only per-user tools and requests tagged
    /// [`PerUser`](crate::PerUser)).
    pub per_user: bool,
    /// Per-tool settings.
    pub tools: HashMap<String, ToolCacheConfig>,
}

/// The settings that apply to one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePolicy {
    /// Fresh TTL; zero = off.
    pub ttl: Duration,
    /// Stale-if-error grace; zero = off.
    pub stale_if_error: Duration,
    /// Whether keys are namespaced by caller.
    pub per_user: bool,
}

impl CacheConfig {
    /// Sets the TTL of `tool` (builder style).
    pub fn with_ttl(mut self, tool: impl Into<String>, ttl: Duration) -> Self {
        self.tools.entry(tool.into()).or_default().ttl = ttl;
        self
    }

    /// Sets the layer-wide stale-if-error grace (builder style).
    pub fn with_stale_if_error(mut self, grace: Duration) -> Self {
        self.stale_if_error = grace;
        self
    }

    /// The settings for `tool`.
    pub fn policy_for(&self, tool: &str) -> CachePolicy {
        match self.tools.get(tool) {
            Some(t) => CachePolicy {
                ttl: t.ttl,
                stale_if_error: t.stale_if_error.unwrap_or(self.stale_if_error),
                per_user: t.per_user.unwrap_or(self.per_user),
            },
            None => self.default_policy(),
        }
    }

    /// The settings of a tool without its own section.
    pub(crate) fn default_policy(&self) -> CachePolicy {
        CachePolicy {
            ttl: self.default_ttl,
            stale_if_error: self.stale_if_error,
            per_user: self.per_user,
        }
    }

    /// Every problem at once (TTLs and graces at most
    /// [`MAX_DURATION`](toolshield_core::config::MAX_DURATION), tool names not empty).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check_duration(self.default_ttl, "default_ttl");
        p.check_duration(self.stale_if_error, "stale_if_error");
        let mut names: Vec<&String> = self.tools.keys().collect();
        names.sort();
        for name in names {
            let t = &self.tools[name];
            p.check(!name.is_empty(), "tools", "tool name must not be empty");
            p.check_duration(t.ttl, format!("tools.{name}.ttl"));
            if let Some(g) = t.stale_if_error {
                p.check_duration(g, format!("tools.{name}.stale_if_error"));
            }
        }
        p.into_result()
    }
}
