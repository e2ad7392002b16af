//! [`RedisIdempotencyStore`]: idempotency records in Redis, exactly-once across processes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use toolshield_idempotency::{
    ClaimOutcome, IdempotencyRecord, IdempotencyStore, StoreError, StoreFuture,
};

use crate::connection::{LuaScript, RedisConnection};
use crate::error::Error;

/// The claim on servers older than 7.0 (no `SET ... NX GET`): read, else create.
const CLAIM: &str = r#"
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"#;

/// The owner check every fenced script starts with: the record is PENDING (records are
/// written by serde with `status` first, so a prefix test spares decoding a large
/// COMPLETED record) and its owner is ARGV[1].
const CHECK: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 19) ~= '{"status":"PENDING"' then return 0 end
local ok, rec = pcall(cjson.decode, v)
if not ok or type(rec) ~= 'table' or rec.owner ~= ARGV[1] then return 0 end
"#;

/// complete / fail: ARGV = owner, record, ttl ms.
const FINISH_TAIL: &str = r#"
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"#;

/// renew: ARGV = owner, lease ms, new lease_until (RFC 3339). The record is rewritten by
/// string substitution so its field order (and the PENDING prefix) is kept.
const RENEW_TAIL: &str = r#"
local nv = (string.gsub(v, '"lease_until":"[^"]*"', '"lease_until":"' .. ARGV[3] .. '"', 1))
nv = (string.gsub(nv, '"expires_at":"[^"]*"', '"expires_at":"' .. ARGV[3] .. '"', 1))
redis.call('SET', KEYS[1], nv, 'PX', ARGV[2])
return 1
"#;

/// release: ARGV = owner.
const RELEASE_TAIL: &str = r#"
redis.call('DEL', KEYS[1])
return 1
"#;

fn script(tail: &str) -> LuaScript {
    LuaScript::new(format!("{CHECK}{tail}"))
}

struct Scripts {
    claim: LuaScript,
    finish: LuaScript,
    renew: LuaScript,
    release: LuaScript,
}

impl Scripts {
    fn get() -> &'static Scripts {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(|| Scripts {
            claim: LuaScript::new(CLAIM),
            finish: script(FINISH_TAIL),
            renew: script(RENEW_TAIL),
            release: script(RELEASE_TAIL),
        })
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn encode(record: &IdempotencyRecord) -> Result<String, Error> {
    serde_json::to_string(record).map_err(|e| Error::new(format!("record does not encode: {e}")))
}

fn decode(json: &str) -> Result<IdempotencyRecord, Error> {
    serde_json::from_str(json).map_err(|e| Error::new(format!("corrupt idempotency record: {e}")))
}

/// An [`IdempotencyStore`] in Redis: every process that points at the same Redis shares
/// the records, so a mutating call runs once across all of them.
///
/// Each operation is one round trip (see the crate docs for the key layout and the
/// scripts): `claim` is `SET key record NX PX lease GET` (a Lua script on servers older
/// than 7.0), `complete`/`fail`/`renew`/`release` are one owner-checked Lua script each,
/// `get` is one `GET`, `remove` one `DEL`. Every operation is bounded by the connection's
/// operation timeout; a failure or timeout is a [`StoreError`], which the idempotency
/// layer turns into `STORE_UNAVAILABLE` (fail-closed) or a run without dedupe (fail-open).
///
/// Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct RedisIdempotencyStore {
    conn: RedisConnection,
    legacy_claim: std::sync::Arc<AtomicBool>,
}

impl RedisIdempotencyStore {
    /// A store on `conn`.
    pub fn new(conn: RedisConnection) -> Self {
        RedisIdempotencyStore {
            conn,
            legacy_claim: std::sync::Arc::new(AtomicBool::new(false)),
        }
    }

    /// A store that claims with a Lua script (`GET`, then `SET NX PX`) instead of
    /// `SET ... NX PX ... GET`: for proxies that reject `SET ... GET`. Servers older than
    /// 7.0 are detected and switched over by [`new`](Self::new) on their first claim.
    pub fn with_script_claim(conn: RedisConnection) -> Self {
        RedisIdempotencyStore {
            conn,
            legacy_claim: std::sync::Arc::new(AtomicBool::new(true)),
        }
    }

    /// The connection.
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }

    /// `PING` within the health timeout: the round-trip time, or why Redis is not healthy.
    pub async fn health(&self) -> Result<Duration, Error> {
        self.conn.health().await
    }

    async fn claim_now(
        &self,
        key: &str,
        record: IdempotencyRecord,
        lease: Duration,
    ) -> Result<ClaimOutcome, Error> {
        let key = self.conn.key(key);
        let json = encode(&record)?;
        let ms = millis(lease);
        let existing: Option<String> = if self.legacy_claim.load(Ordering::Relaxed) {
            self.legacy(&key, &json, ms).await?
        } else {
            let mut cmd = redis::cmd("SET");
            cmd.arg(&*key)
                .arg(&json)
                .arg("NX")
                .arg("PX")
                .arg(ms)
                .arg("GET");
            match self.conn.query("claim", &cmd).await {
                Ok(v) => v,
                // Redis < 7.0 rejects NX together with GET: use the script from now on.
                Err(e) if e.message().to_ascii_lowercase().contains("syntax error") => {
                    self.legacy_claim.store(true, Ordering::Relaxed);
                    tracing::debug!("redis: SET NX GET unsupported, claiming with a script");
                    self.legacy(&key, &json, ms).await?
                }
                Err(e) => return Err(e),
            }
        };
        match existing {
            None => Ok(ClaimOutcome::Claimed),
            Some(json) => Ok(ClaimOutcome::Existing(decode(&json)?)),
        }
    }

    async fn legacy(&self, key: &str, json: &str, ms: u64) -> Result<Option<String>, Error> {
        self.conn
            .eval("claim", &Scripts::get().claim, |c| {
                c.arg(1).arg(key).arg(json).arg(ms);
            })
            .await
    }

    async fn finish(
        &self,
        key: &str,
        owner: &str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let key = self.conn.key(key);
        let json = encode(&record)?;
        let ms = millis(ttl);
        let done: i64 = self
            .conn
            .eval("record outcome", &Scripts::get().finish, |c| {
                c.arg(1).arg(&*key).arg(owner).arg(&json).arg(ms);
            })
            .await?;
        Ok(done == 1)
    }

    async fn renew_now(&self, key: &str, owner: &str, lease: Duration) -> Result<bool, Error> {
        let key = self.conn.key(key);
        let until = chrono::Duration::from_std(lease)
            .ok()
            .and_then(|d| Utc::now().checked_add_signed(d))
            .unwrap_or(chrono::DateTime::<Utc>::MAX_UTC);
        // The exact text serde writes for the record's timestamps.
        let until = serde_json::to_string(&until)
            .map_err(|e| Error::new(format!("lease time does not encode: {e}")))?;
        let until = until.trim_matches('"');
        let ms = millis(lease);
        let done: i64 = self
            .conn
            .eval("renew", &Scripts::get().renew, |c| {
                c.arg(1).arg(&*key).arg(owner).arg(ms).arg(until);
            })
            .await?;
        Ok(done == 1)
    }

    async fn release_now(&self, key: &str, owner: &str) -> Result<bool, Error> {
        let key = self.conn.key(key);
        let done: i64 = self
            .conn
            .eval("release", &Scripts::get().release, |c| {
                c.arg(1).arg(&*key).arg(owner);
            })
            .await?;
        Ok(done == 1)
    }

    async fn get_now(&self, key: &str) -> Result<Option<IdempotencyRecord>, Error> {
        let key = self.conn.key(key);
        let json: Option<String> = self.conn.query("get", redis::cmd("GET").arg(&*key)).await?;
        json.as_deref().map(decode).transpose()
    }

    async fn remove_now(&self, key: &str) -> Result<bool, Error> {
        let key = self.conn.key(key);
        let n: i64 = self
            .conn
            .query("remove", redis::cmd("DEL").arg(&*key))
            .await?;
        Ok(n > 0)
    }
}

fn store<T>(r: Result<T, Error>) -> Result<T, StoreError> {
    r.map_err(StoreError::from)
}

impl IdempotencyStore for RedisIdempotencyStore {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        record: IdempotencyRecord,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move { store(self.claim_now(key, record, lease).await) })
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move { store(self.finish(key, owner, record, ttl).await) })
    }

    fn fail<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move { store(self.finish(key, owner, record, ttl).await) })
    }

    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async move { store(self.renew_now(key, owner, lease).await) })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move { store(self.release_now(key, owner).await) })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<IdempotencyRecord>> {
        Box::pin(async move { store(self.get_now(key).await) })
    }

    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move { store(self.remove_now(key).await) })
    }
}
