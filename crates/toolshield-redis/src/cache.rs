//! [`RedisCacheStore`]: cached responses in Redis, shared by every process.

use std::time::Duration;

use toolshield_cache::{CacheLookup, CacheStore, StoreError, StoreFuture};
use toolshield_core::config::MAX_DURATION;
use toolshield_core::ToolResponse;

use crate::connection::{LuaScript, RedisConnection};
use crate::error::Error;
use crate::idempotency::millis;

/// The entry and its time left, atomically.
const GET_WITH_TTL: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v then return false end
return {v, redis.call('PTTL', KEYS[1])}
"#;

fn get_script() -> &'static LuaScript {
    static S: std::sync::OnceLock<LuaScript> = std::sync::OnceLock::new();
    S.get_or_init(|| LuaScript::new(GET_WITH_TTL))
}

/// A [`CacheStore`] in Redis: entries are `{output, provenance}` JSON strings under the
/// connection's key prefix followed by the key the cache layer gives
/// ([`toolshield_cache::storage_key`]: `cache:{tool}:-:<digest>`, or
/// `cache:{tool}:s<len>:<caller>:<digest>`, injective in tool and caller), with a `PX`
/// TTL, shared by every process on the same Redis.
///
/// A TTL longer than [`MAX_DURATION`] is written as `MAX_DURATION`. An entry without an
/// expiry (left by another client) is a miss: the layer fetches and writes it again.
///
/// `get` is one round trip (a Lua script returning the value and its `PTTL`), `put` one
/// `SET key json PX ttl`, `remove` one `DEL`. Each is bounded by the connection's
/// operation timeout; a failure is a [`StoreError`], which the cache layer treats as a miss
/// (it never fails a call because the cache is down).
///
/// Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct RedisCacheStore {
    conn: RedisConnection,
}

impl RedisCacheStore {
    /// A store on `conn`.
    pub fn new(conn: RedisConnection) -> Self {
        RedisCacheStore { conn }
    }

    /// The connection.
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }

    /// `PING` within the health timeout: the round-trip time, or why Redis is not healthy.
    pub async fn health(&self) -> Result<Duration, Error> {
        self.conn.health().await
    }

    async fn get_now(&self, key: &str) -> Result<Option<CacheLookup>, Error> {
        let key = self.conn.key(key);
        let found: Option<(String, i64)> = self
            .conn
            .eval("cache get", get_script(), |c| {
                c.arg(1).arg(&*key);
            })
            .await?;
        let Some((json, pttl)) = found else {
            return Ok(None);
        };
        // -1: no expiry (written by something else): its freshness is unknown, and served
        // it would be for good; a miss, so the layer fetches and writes it back with a TTL.
        // -2: expired in between.
        let Ok(ms) = u64::try_from(pttl) else {
            return Ok(None);
        };
        let ttl_left = Duration::from_millis(ms);
        let response: ToolResponse = serde_json::from_str(&json)
            .map_err(|e| Error::new(format!("corrupt cache entry: {e}")))?;
        Ok(Some(CacheLookup { response, ttl_left }))
    }

    async fn put_now(
        &self,
        key: &str,
        response: &ToolResponse,
        ttl: Duration,
    ) -> Result<(), Error> {
        if ttl.is_zero() {
            return Ok(());
        }
        let key = self.conn.key(key);
        let json = serde_json::to_string(response)
            .map_err(|e| Error::new(format!("response does not encode: {e}")))?;
        let mut cmd = redis::cmd("SET");
        // Bounded: Redis refuses an expiry past its clock's range (a longer TTL would
        // leave the entry unwritten).
        cmd.arg(&*key)
            .arg(json)
            .arg("PX")
            .arg(millis(ttl.min(MAX_DURATION)));
        let _: () = self.conn.query("cache put", &cmd).await?;
        Ok(())
    }

    async fn remove_now(&self, key: &str) -> Result<bool, Error> {
        let key = self.conn.key(key);
        let n: i64 = self
            .conn
            .query("cache remove", redis::cmd("DEL").arg(&*key))
            .await?;
        Ok(n > 0)
    }
}

impl CacheStore for RedisCacheStore {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<CacheLookup>> {
        Box::pin(async move { self.get_now(key).await.map_err(StoreError::from) })
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        response: ToolResponse,
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.put_now(key, &response, ttl)
                .await
                .map_err(StoreError::from)
        })
    }

    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move { self.remove_now(key).await.map_err(StoreError::from) })
    }
}
