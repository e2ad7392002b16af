//! [`RedisConnection`]: one self-reconnecting, multiplexed connection shared by the stores,
//! with a per-operation timeout and a round-trip counter.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue};
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

/// A connection to Redis shared by every store built on it.
///
/// It wraps the `redis` crate's `ConnectionManager`: one multiplexed TCP connection that
/// reconnects by itself (with backoff capped by
/// [`reconnect_max_delay`](RedisConfig::reconnect_max_delay)) when Redis goes away, so a
/// stack keeps working after a Redis restart without being rebuilt. Every operation is
/// bounded by [`op_timeout`](RedisConfig::op_timeout). Clones share the connection and
/// the counters.
#[derive(Clone)]
pub struct RedisConnection {
    manager: ConnectionManager,
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
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| Error::redis("invalid url", &e))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.op_timeout))
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(config.reconnect_max_delay)
            .set_number_of_retries(3);
        let manager = ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| Error::redis("connection", &e))?;
        Ok(RedisConnection {
            manager,
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

    /// Round trips sent to Redis through this connection (and its clones) so far: a
    /// counter for benches and tests (a first execution costs 2, a replay 1).
    pub fn round_trips(&self) -> u64 {
        self.shared.round_trips.load(Ordering::Relaxed)
    }

    /// `PING` within [`health_timeout`](RedisConfig::health_timeout): the round-trip time,
    /// or why Redis is not healthy. For a health endpoint.
    pub async fn health(&self) -> Result<Duration, Error> {
        let started = Instant::now();
        let timeout = self.shared.config.health_timeout;
        let pong: String = self
            .query_within("ping", &redis::cmd("PING"), timeout)
            .await?;
        if pong == "PONG" {
            Ok(started.elapsed())
        } else {
            Err(Error::new(format!("ping answered {pong:?}")))
        }
    }

    /// `INFO section` (`"commandstats"`, `"server"`, ...): the server's report, for
    /// diagnostics and benches. Counts as a round trip.
    pub async fn info(&self, section: &str) -> Result<String, Error> {
        self.query("info", redis::cmd("INFO").arg(section)).await
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
        let mut con = self.manager.clone();
        self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(timeout, cmd.query_async::<T>(&mut con)).await {
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
            let mut con = self.manager.clone();
            let mut sha = redis::cmd("EVALSHA");
            sha.arg(&script.sha);
            fill(&mut sha);
            self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
            match sha.query_async::<T>(&mut con).await {
                Err(e) if e.code() == Some("NOSCRIPT") => {
                    let mut eval = redis::cmd("EVAL");
                    eval.arg(&script.src);
                    fill(&mut eval);
                    self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
                    eval.query_async::<T>(&mut con).await
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
