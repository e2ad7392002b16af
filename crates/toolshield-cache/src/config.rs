//! Configuration of the cache layer.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolshield_core::config::{duration, ConfigError, Problems, MAX_DURATION};

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

/// The cache policy of one layer, and so of one tool: the facade builds one cache layer
/// per tool from its section. Caching is off (TTL 0) unless a TTL is set.
///
/// ```
/// use std::time::Duration;
/// use toolshield_cache::CacheConfig;
///
/// let cfg: CacheConfig =
///     serde_json::from_str(r#"{"ttl": "10m", "stale_if_error": "5m", "per_user": true}"#).unwrap();
/// cfg.validate().unwrap();
/// assert_eq!(cfg.ttl, Duration::from_secs(600));
/// assert_eq!(CacheConfig::default().with_ttl(Duration::from_secs(60)).ttl, Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// How long a result is fresh; zero (the default) means off.
    #[serde(with = "duration")]
    pub ttl: Duration,
    /// How long past its TTL an entry may still be served, marked `stale`, when the tool
    /// fails or its circuit is open; zero (the default) means off.
    #[serde(with = "duration")]
    pub stale_if_error: Duration,
    /// Namespace every key by caller id (else only requests tagged
    /// [`PerUser`](crate::PerUser)).
    pub per_user: bool,
}

impl From<&ToolCacheConfig> for CacheConfig {
    /// A section's settings, unset ones at their defaults (no grace, shared results).
    fn from(section: &ToolCacheConfig) -> Self {
        CacheConfig {
            ttl: section.ttl,
            stale_if_error: section.stale_if_error.unwrap_or_default(),
            per_user: section.per_user.unwrap_or(false),
        }
    }
}

impl CacheConfig {
    /// The same policy with a fresh TTL of `ttl`.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The same policy with a stale-if-error grace of `grace`.
    #[must_use]
    pub fn with_stale_if_error(mut self, grace: Duration) -> Self {
        self.stale_if_error = grace;
        self
    }

    /// The same policy, results per caller (or not).
    #[must_use]
    pub fn with_per_user(mut self, per_user: bool) -> Self {
        self.per_user = per_user;
        self
    }

    /// The policy as entries are kept: `stale_if_error` cut so that TTL and grace
    /// together stay within [`MAX_DURATION`], the longest a store keeps an entry. The time
    /// an entry has left decides fresh or stale, so a grace the store could not add would
    /// be taken from the fresh TTL (at `MAX_DURATION` each, all of it).
    pub(crate) fn kept(self) -> Self {
        CacheConfig {
            stale_if_error: self
                .stale_if_error
                .min(MAX_DURATION.saturating_sub(self.ttl)),
            ..self
        }
    }

    /// Every problem: each duration at most
    /// [`MAX_DURATION`](toolshield_core::config::MAX_DURATION).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check_duration(self.ttl, "ttl");
        p.check_duration(self.stale_if_error, "stale_if_error");
        p.into_result()
    }
}

impl ToolCacheConfig {
    /// Every problem of a section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        CacheConfig::from(self).validate()
    }
}
