//! [`RedisConnection`]: one self-reconnecting, multiplexed connection (to one node, or to
//! every node of a Redis Cluster) shared by the stores, with a per-operation timeout and a
//! round-trip counter.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, RedisResult};
use tokio::time::Instant;
use toolshield_core::ConfigError;

use crate::config::RedisConfig;
use crate::error::Error;

/// A Lua script known by its source and SHA-1 (sent as `EVALSHA`; on `NOSCRIPT`, after a
/// restart or a failover, sent once as `EVAL`, which also caches it again).
pub(crate) struct LuaScript {
    src: String,
    sha: String,
}

impl LuaScript {
    pub(crate) fn new(src: impl Into<String>) -> Self {
        let src = src.into();
        let sha = redis::Script::new(&src).get_hash().to_owned();
        LuaScript { src, sha }
    }
}

struct Shared {
    config: RedisConfig,
    round_trips: AtomicU64,
}

/// What the commands go through: one node, or a cluster.
#[derive(Clone)]
enum Backend {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Backend {
    /// Sends `cmd` (no timeout of its own: the caller bounds it).
    ///
    /// A refused connection is sent once more: the command never left, since there was
    /// no connection to send it on. After an outage long enough for every reconnection
    /// attempt to fail, the client holds that failed connection, answers the next command
    /// with its error and only then connects anew; without the second send, the first
    /// command after Redis came back would fail against a healthy server. Any other
    /// error may come after the command was sent, and is returned as it is.
    async fn send<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self.send_once(cmd).await {
            Err(e) if e.is_connection_refusal() => self.send_once(cmd).await,
            result => result,
        }
    }

    async fn send_once<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        // Both handles are cheap clones of a channel to one background task.
        match self {
            Backend::Node(m) => cmd.query_async(&mut m.clone()).await,
            Backend::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

/// A connection to Redis shared by every store built on it.
///
/// To one node, it wraps the `redis` crate's `ConnectionManager`: one multiplexed TCP
/// connection that reconnects by itself (with backoff capped by
/// [`reconnect_max_delay`](RedisConfig::reconnect_max_delay)) when Redis goes away, so a
/// stack keeps working after a Redis restart without being rebuilt. To a Redis Cluster
/// ([`RedisConfig::cluster_nodes`]), it wraps the crate's async cluster connection: one
/// multiplexed connection per node, the slot map read from the seeds, `MOVED`/`ASK`
/// redirections and failovers followed by the client (with the same capped backoff).
/// Every key an operation touches carries the tool's hash tag, so each operation is one
/// command on one slot either way. Every operation is bounded by
/// [`op_timeout`](RedisConfig::op_timeout). Clones share the connection and the counters.
#[derive(Clone)]
pub struct RedisConnection {
    backend: Backend,
    shared: Arc<Shared>,
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConnection")
            .field("config", &self.shared.config)
            .field("round_trips", &self.round_trips())
            .finish_non_exhaustive()
    }
}

/// Why [`RedisConnection::connect`] failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The configuration is invalid (every problem listed).
    Config(ConfigError),
    /// Redis could not be reached.
    Redis(Error),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Config(e) => e.fmt(f),
            ConnectError::Redis(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Config(e) => Some(e),
            ConnectError::Redis(e) => Some(e),
        }
    }
}

impl From<ConfigError> for ConnectError {
    fn from(e: ConfigError) -> Self {
        ConnectError::Config(e)
    }
}

impl From<Error> for ConnectError {
    fn from(e: Error) -> Self {
        ConnectError::Redis(e)
    }
}

impl RedisConnection {
    /// Connects to `config.url` and checks that Redis answers (within `connect_timeout`).
    pub async fn connect(config: RedisConfig) -> Result<Self, ConnectError> {
        let conn = Self::connect_lazy(config)?;
        conn.health().await?;
        Ok(conn)
    }

    /// Builds the connection without waiting for Redis: the first operation connects. A
    /// service can start while Redis is still down (its first calls see store errors).
    /// Must be called inside a tokio runtime.
    pub fn connect_lazy(config: RedisConfig) -> Result<Self, ConnectError> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(
                Error::new("a redis connection must be built inside a tokio runtime").into(),
            );
        }
        let backend = if config.is_cluster() {
            Backend::Cluster(cluster_connection(&config)?)
        } else {
            let client = redis::Client::open(config.url.as_str())
                .map_err(|e| Error::redis("invalid url", &e))?;
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.op_timeout))
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(config.reconnect_max_delay)
                .set_number_of_retries(3);
            Backend::Node(
                ConnectionManager::new_lazy_with_config(client, manager_config)
                    .map_err(|e| Error::redis("connection", &e))?,
            )
        };
        Ok(RedisConnection {
            backend,
            shared: Arc::new(Shared {
                config,
                round_trips: AtomicU64::new(0),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    /// Whether this is a connection to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster(_))
    }

    /// The URL of a node to open a pub/sub subscription on, for the `attempt`-th try: the
    /// URL, or the cluster's seeds in turn (a `PUBLISH` on any node of a cluster reaches
    /// the subscribers on every node).
    pub(crate) fn subscription_url(&self, attempt: usize) -> &str {
        let nodes = &self.shared.config.cluster_nodes;
        if nodes.is_empty() {
            &self.shared.config.url
        } else {
            &nodes[attempt % nodes.len()]
        }
    }

    /// Round trips sent to Redis through this connection (and its clones) so far: a
    /// counter for benches and tests (a first execution costs 2, a replay 1).
    pub fn round_trips(&self) -> u64 {
        self.shared.round_trips.load(Ordering::Relaxed)
    }

    /// `PING` within [`health_timeout`](RedisConfig::health_timeout): the round-trip time,
    /// or why Redis is not healthy. For a health endpoint.
    ///
    /// On a cluster the `PING` goes to every master the client knows, then `CLUSTER INFO`
    /// (one node) must report `cluster_state:ok` with all 16384 slots served: a master
    /// that is down makes the cluster unhealthy, before and after the other nodes mark it
    /// failed, since its slots are unavailable. Two round trips, each within the timeout.
    pub async fn health(&self) -> Result<Duration, Error> {
        let started = Instant::now();
        let timeout = self.shared.config.health_timeout;
        let pong: String = self
            .query_within("ping", &redis::cmd("PING"), timeout)
            .await?;
        if pong != "PONG" {
            return Err(Error::new(format!("ping answered {pong:?}")));
        }
        if self.is_cluster() {
            let info: String = self
                .query_within("cluster info", redis::cmd("CLUSTER").arg("INFO"), timeout)
                .await?;
            cluster_healthy(&info)?;
        }
        Ok(started.elapsed())
    }

    /// `INFO section` (`"commandstats"`, `"server"`, ...): the server's report, for
    /// diagnostics and benches. Counts as a round trip. On a cluster, every master's
    /// report, each after a `# node <address>` line.
    pub async fn info(&self, section: &str) -> Result<String, Error> {
        let v: redis::Value = self.query("info", redis::cmd("INFO").arg(section)).await?;
        info_text(v)
    }

    /// `key` with the configured prefix.
    pub(crate) fn key<'a>(&self, key: &'a str) -> Cow<'a, str> {
        let prefix = &self.shared.config.key_prefix;
        if prefix.is_empty() {
            Cow::Borrowed(key)
        } else {
            let mut s = String::with_capacity(prefix.len() + key.len());
            s.push_str(prefix);
            s.push_str(key);
            Cow::Owned(s)
        }
    }

    /// One command, one round trip, bounded by the operation timeout.
    pub(crate) async fn query<T: FromRedisValue>(&self, what: &str, cmd: &Cmd) -> Result<T, Error> {
        self.query_within(what, cmd, self.shared.config.op_timeout)
            .await
    }

    async fn query_within<T: FromRedisValue>(
        &self,
        what: &str,
        cmd: &Cmd,
        timeout: Duration,
    ) -> Result<T, Error> {
        self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(timeout, self.backend.send::<T>(cmd)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_timeout() => Err(Error::timeout(what, timeout)),
            Ok(Err(e)) => Err(Error::redis(what, &e)),
            Err(_) => Err(Error::timeout(what, timeout)),
        }
    }

    /// Runs `script` with the keys and arguments `fill` appends (`numkeys key... arg...`):
    /// one `EVALSHA` round trip, plus one `EVAL` after the server lost its script cache.
    /// The whole operation is bounded by the operation timeout.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        what: &str,
        script: &LuaScript,
        fill: impl Fn(&mut Cmd),
    ) -> Result<T, Error> {
        let timeout = self.shared.config.op_timeout;
        let run = async {
            let mut sha = redis::cmd("EVALSHA");
            sha.arg(&script.sha);
            fill(&mut sha);
            self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
            // On a cluster, both are routed by their first key (the slot of the tool's tag),
            // and each master keeps its own script cache.
            match self.backend.send::<T>(&sha).await {
                Err(e) if e.code() == Some("NOSCRIPT") => {
                    let mut eval = redis::cmd("EVAL");
                    eval.arg(&script.src);
                    fill(&mut eval);
                    self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
                    self.backend.send::<T>(&eval).await
                }
                r => r,
            }
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_timeout() => Err(Error::timeout(what, timeout)),
            Ok(Err(e)) => Err(Error::redis(what, &e)),
            Err(_) => Err(Error::timeout(what, timeout)),
        }
    }
}

/// The cluster connection of `config` (lazy: nodes are reached on the first command).
fn cluster_connection(config: &RedisConfig) -> Result<ClusterConnection, Error> {
    let max_wait = u64::try_from(config.reconnect_max_delay.as_millis()).unwrap_or(u64::MAX);
    let client = ClusterClientBuilder::new(config.cluster_nodes.iter().map(String::as_str))
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.op_timeout)
        .overall_response_timeout(Some(config.op_timeout))
        // Redirections and waits for a failover are retried by the client within the
        // operation timeout; waits start at 10 ms (the crate's default starts at 1.28 s,
        // longer than an operation may take) and double up to `reconnect_max_delay`.
        .retries(8)
        .min_retry_wait(10)
        .max_retry_wait(max_wait.max(10))
        .retry_wait_formula(10, 2)
        .build()
        .map_err(|e| Error::redis("invalid cluster configuration", &e))?;
    let cluster_config = ClusterConfig::new()
        .set_connection_timeout(config.connect_timeout)
        .set_response_timeout(config.op_timeout);
    Ok(client.get_pending_async_connection_with_config(cluster_config))
}

/// Whether a `CLUSTER INFO` report shows a cluster that serves every slot.
fn cluster_healthy(info: &str) -> Result<(), Error> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("?")
    };
    let state = field("cluster_state:");
    let ok = field("cluster_slots_ok:");
    if state == "ok" && ok == "16384" {
        Ok(())
    } else {
        Err(Error::new(format!(
            "cluster state {state}, {ok} of 16384 slots served ({} failing, {} possibly failing)",
            field("cluster_slots_fail:"),
            field("cluster_slots_pfail:")
        )))
    }
}

/// The text of an `INFO` answer: one node's string, or every master's on a cluster.
fn info_text(v: redis::Value) -> Result<String, Error> {
    match v {
        redis::Value::Map(nodes) => {
            let mut out = String::new();
            for (node, text) in nodes {
                let node: String =
                    redis::from_redis_value(node).map_err(|e| Error::new(format!("info: {e}")))?;
                let text: String =
                    redis::from_redis_value(text).map_err(|e| Error::new(format!("info: {e}")))?;
                out.push_str("# node ");
                out.push_str(&node);
                out.push_str("\r\n");
                out.push_str(&text);
            }
            Ok(out)
        }
        v => redis::from_redis_value(v).map_err(|e| Error::new(format!("info: {e}"))),
    }
}
