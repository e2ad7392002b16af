//! [`RedisConfig`]: where Redis is and how long a store operation may take.

use std::time::Duration;

use redis::IntoConnectionInfo;
use serde::{Deserialize, Serialize};
use toolshield_core::config::{duration, ConfigError, Problems};

/// Configuration of a Redis connection shared by the stores.
///
/// One node by [`url`](Self::url), or a Redis Cluster by its seed nodes
/// ([`cluster_nodes`](Self::cluster_nodes): a list of `redis://host:port` URLs, as the
/// `redis` crate's `ClusterClient` takes them; the client discovers the other nodes and
/// the slot map from any seed that answers).
///
/// ```
/// use std::time::Duration;
/// use toolshield_redis::RedisConfig;
///
/// let cfg: RedisConfig = serde_json::from_str(
///     r#"{"url": "redis://10.0.0.5:6379/2", "op_timeout": "100ms", "key_prefix": "prod:"}"#,
/// ).unwrap();
/// assert_eq!(cfg.op_timeout, Duration::from_millis(100));
/// cfg.validate().unwrap();
/// assert!(RedisConfig { url: "http://x".into(), ..RedisConfig::default() }.validate().is_err());
///
/// let cluster: RedisConfig = serde_json::from_str(
///     r#"{"cluster_nodes": ["redis://10.0.0.5:7000", "redis://10.0.0.6:7000"]}"#,
/// ).unwrap();
/// assert!(cluster.is_cluster());
/// cluster.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://` when the `redis` crate is
    /// built with TLS, or `redis+unix:///path`). Not used when
    /// [`cluster_nodes`](Self::cluster_nodes) is set (leave it at its default then).
    pub url: String,
    /// Seed nodes of a Redis Cluster, each `redis://[user:password@]host:port` (database 0,
    /// the only one a cluster has; every seed with the same credentials). Empty (the
    /// default): one node at [`url`](Self::url). A few seeds are enough: the client reads
    /// the slot map from the first that answers and follows `MOVED`/`ASK` redirections
    /// and failovers by itself.
    pub cluster_nodes: Vec<String>,
    /// The longest one store operation (one round trip) may take; past it the operation
    /// fails with a store error, which the layers turn into `STORE_UNAVAILABLE`
    /// (idempotency fail-closed), a run without dedupe (fail-open) or a cache miss.
    #[serde(with = "duration")]
    pub op_timeout: Duration,
    /// The longest one connection attempt may take.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// The longest the `PING` of [`health`](crate::RedisConnection::health) may take.
    #[serde(with = "duration")]
    pub health_timeout: Duration,
    /// Prepended to every key (`prod:idemp:{pay}:k1`), so several deployments can share
    /// one Redis. It must not contain `{` or `}` (the hash tag must stay the tool's), nor
    /// end with `lease:`, `breaker:` or `toolshield:rl:` (namespaces of toolshield's own
    /// keys: the keys of `prod:lease:` would be those of `prod:`), so the keys of two
    /// deployments with different prefixes never meet.
    pub key_prefix: String,
    /// The longest wait between two reconnection attempts after Redis went away.
    #[serde(with = "duration")]
    pub reconnect_max_delay: Duration,
}

/// What one of toolshield's keys has before its hash tag beyond another key's: a lease
/// marker is `lease:` + a record key (`lease:idemp:{..}` against `idemp:{..}`), and a
/// breaker hash (`breaker:{..}`) or a rate-limit key (`toolshield:rl:{..}`) ends with its
/// tag as a budget key (`{toolshield:budget:..}`) does. The keys of a prefix `P` + one of
/// these could be keys of the prefix `P`, so no prefix may end with one; with that, two
/// different valid prefixes never share a key (a prefix holds no brace, so where its keys'
/// tag starts tells the prefix).
const NESTED_NAMESPACES: [&str; 3] = ["lease:", "breaker:", "toolshield:rl:"];

/// The default [`RedisConfig::url`].
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: DEFAULT_URL.to_owned(),
            cluster_nodes: Vec::new(),
            op_timeout: Duration::from_millis(250),
            connect_timeout: Duration::from_secs(1),
            health_timeout: Duration::from_millis(200),
            key_prefix: String::new(),
            reconnect_max_delay: Duration::from_secs(1),
        }
    }
}

impl RedisConfig {
    /// The default configuration pointed at `url`.
    pub fn from_url(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            ..RedisConfig::default()
        }
    }

    /// The default configuration pointed at a Redis Cluster through `nodes`, its seed
    /// nodes (`redis://host:port` each).
    pub fn cluster<I, S>(nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisConfig {
            cluster_nodes: nodes.into_iter().map(Into::into).collect(),
            ..RedisConfig::default()
        }
    }

    /// Whether this configuration points at a Redis Cluster (seed nodes are given).
    pub fn is_cluster(&self) -> bool {
        !self.cluster_nodes.is_empty()
    }

    /// The same configuration with another per-operation timeout (at most
    /// [`MAX_DURATION`](toolshield_core::config::MAX_DURATION): a longer one makes
    /// [`validate`](Self::validate), and so every connect, fail).
    pub fn with_op_timeout(mut self, op_timeout: Duration) -> Self {
        self.op_timeout = op_timeout;
        self
    }

    /// The same configuration with another key prefix.
    pub fn with_key_prefix(mut self, key_prefix: impl Into<String>) -> Self {
        self.key_prefix = key_prefix.into();
        self
    }

    /// Every problem at once: the URL (or every cluster seed, a TCP `redis://` URL to
    /// database 0, with the URL left at its default) must parse, timeouts and delays must be at least
    /// 1 ms and at most [`MAX_DURATION`](toolshield_core::config::MAX_DURATION), the
    /// prefix must not contain a brace nor end with a namespace of toolshield's keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        if self.cluster_nodes.is_empty() {
            if let Err(e) = self.url.as_str().into_connection_info() {
                p.push("url", format_args!("not a redis url: {e}"));
            }
        } else {
            if self.url != DEFAULT_URL {
                p.push(
                    "url",
                    "set either `url` (one node) or `cluster_nodes` (a cluster), not both",
                );
            }
            for (i, node) in self.cluster_nodes.iter().enumerate() {
                let path = format!("cluster_nodes[{i}]");
                match node.as_str().into_connection_info() {
                    Err(e) => p.push(&path, format_args!("not a redis url: {e}")),
                    Ok(info) => {
                        if matches!(info.addr(), redis::ConnectionAddr::Unix(_)) {
                            p.push(
                                &path,
                                "a cluster node is reached over TCP, not a unix socket",
                            );
                        }
                        if info.redis_settings().db() != 0 {
                            p.push(&path, "a cluster has only database 0");
                        }
                    }
                }
            }
        }
        let ms = Duration::from_millis(1);
        p.check(self.op_timeout >= ms, "op_timeout", "must be at least 1ms");
        p.check(
            self.connect_timeout >= ms,
            "connect_timeout",
            "must be at least 1ms",
        );
        p.check(
            self.health_timeout >= ms,
            "health_timeout",
            "must be at least 1ms",
        );
        p.check(
            self.reconnect_max_delay >= ms,
            "reconnect_max_delay",
            "must be at least 1ms",
        );
        p.check_duration(self.op_timeout, "op_timeout");
        p.check_duration(self.connect_timeout, "connect_timeout");
        p.check_duration(self.health_timeout, "health_timeout");
        p.check_duration(self.reconnect_max_delay, "reconnect_max_delay");
        p.check(
            !self.key_prefix.contains(['{', '}']),
            "key_prefix",
            "must not contain `{` or `}`",
        );
        if let Some(ns) = NESTED_NAMESPACES
            .iter()
            .find(|ns| self.key_prefix.ends_with(*ns))
        {
            p.push(
                "key_prefix",
                format_args!(
                    "must not end with `{ns}`: a namespace of toolshield's own keys, so the keys \
                     of this prefix would be keys of the prefix without it"
                ),
            );
        }
        p.into_result()
    }
}
