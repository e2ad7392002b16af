//! [`RedisIdempotencyStore`]: idempotency records in Redis, exactly-once across processes.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use toolshield_core::config::MAX_DURATION;
use toolshield_core::Digest;
use toolshield_idempotency::{
    check_resume_token, ClaimOutcome, IdempotencyRecord, IdempotencyStore, RecordStatus,
    StoreError, StoreFuture,
};

use crate::connection::{LuaScript, RedisConnection};
use crate::error::Error;

/// The claim: KEYS = record, lease marker; ARGV = record, lease ms, owner, marker ms, the
/// record's own resume token as JSON (`""` for none), the record's payload digest (hex).
/// Returns `{0, nil}` (claimed), `{2, token}` (claimed over an expired claim: the marker of an
/// owner that never finished was still there; `token` is the resume token it carried, as JSON,
/// or nil), `{1, record}` (held) or `{3, marker}` (held: the expired claim was made for
/// another payload digest, the second line of its marker).
///
/// The marker holds the owner, a line break and the payload digest of the claim, and after
/// `mark_resume` a line break and the token as a JSON string (which has no raw line break:
/// serde escapes control characters, and tokens have none); a tail that is not exactly one
/// JSON string is no token. The key belongs to that digest (the expired owner may have run
/// the call, and a token names work started for it): a claim with another digest does not
/// take it over (a marker without a digest line, as written before the digest was kept, or
/// with one that is not 64 hex characters, holds off no claim). A takeover carries the token
/// into the new record (appended as its last field, where serde writes `resume`) and onto the
/// new marker, so a second takeover finds it too.
///
/// A key left with no expiry by another client (`PTTL -1`) holds no claim forever: a record
/// that is not a finished one (a PENDING record, text that is no record, a value of another
/// type) and a marker get the lease (or the marker's time) as their expiry when a claim
/// finds them; a marker of another type is no marker.
const CLAIM: &str = r#"
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  if redis.call('PTTL', KEYS[1]) == -1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return v
end
if v then
  if string.sub(v, 1, 20) ~= '{"status":"COMPLETED' and string.sub(v, 1, 17) ~= '{"status":"FAILED'
    and redis.call('PTTL', KEYS[1]) == -1 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, v}
end
local prev = redis.pcall('GET', KEYS[2])
if type(prev) == 'table' then prev = false end
local token = false
if prev then
  if redis.call('PTTL', KEYS[2]) == -1 then redis.call('PEXPIRE', KEYS[2], ARGV[4]) end
  local held = string.match(prev, '^[^\n]*\n(%x+)$') or string.match(prev, '^[^\n]*\n(%x+)\n"[^\n]*"$')
  if held and #held == 64 and held ~= ARGV[6] then return {3, prev} end
  token = string.match(prev, '\n("[^\n]*")$') or false
end
if token then
  local ok, t = pcall(cjson.decode, token)
  if not ok or type(t) ~= 'string' then token = false end
end
local rec = ARGV[1]
local mark = ARGV[3] .. '\n' .. ARGV[6]
if ARGV[5] ~= '' then
  mark = mark .. '\n' .. ARGV[5]
elseif token then
  rec = string.sub(rec, 1, -2) .. ',"resume":' .. token .. '}'
  mark = mark .. '\n' .. token
end
redis.call('SET', KEYS[1], rec, 'PX', ARGV[2])
redis.call('SET', KEYS[2], mark, 'PX', ARGV[4])
if prev then return {2, token} end
return {0, false}
"#;

/// Reads the record; every fenced script starts with it.
const GET: &str = r#"
local v = redis.call('GET', KEYS[1])
"#;

/// complete / fail: the very record this call writes is there already: a resend of a
/// write that was applied (the cluster client resends a command whose connection broke
/// after it left). The record carries the claim's owner token, so it is this claim's
/// outcome; the write is reported done, as it was.
const FINISH_RESENT: &str = r#"
if v == ARGV[2] then return 1 end
"#;

/// The owner check every fenced script makes after reading the record: the record is
/// PENDING (records are written by serde with `status` first, so a prefix test spares
/// decoding a large COMPLETED record) and its owner is ARGV[1].
const CHECK: &str = r#"
if not v or string.sub(v, 1, 19) ~= '{"status":"PENDING"' then return 0 end
local ok, rec = pcall(cjson.decode, v)
if not ok or type(rec) ~= 'table' or rec.owner ~= ARGV[1] then return 0 end
"#;

/// finish (a COMPLETED or FAILED record): ARGV = owner, record, ttl ms. The claim ended:
/// its marker goes.
const FINISH_TAIL: &str = r#"
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
return 1
"#;

/// renew: ARGV = owner, lease ms, new lease_until (RFC 3339). The record is rewritten by
/// string substitution so its field order (and the PENDING prefix) is kept; the marker
/// lives one more lease past the record.
const RENEW_TAIL: &str = r#"
local nv = (string.gsub(v, '"lease_until":"[^"]*"', '"lease_until":"' .. ARGV[3] .. '"', 1))
nv = (string.gsub(nv, '"expires_at":"[^"]*"', '"expires_at":"' .. ARGV[3] .. '"', 1))
redis.call('SET', KEYS[1], nv, 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[2]))
return 1
"#;

/// mark_resume: ARGV = owner, token as a JSON string, lease ms, new lease_until (RFC 3339).
/// The record is rewritten as text, like `renew` (field order and the PENDING prefix kept):
/// an earlier token (always the last field: serde writes `resume` last) is cut, the lease
/// moved, and the token appended as the last field. The marker gets the record's payload
/// digest and the token after the owner, and lives one more lease past the record.
const MARK_RESUME_TAIL: &str = r#"
local nv = v
local cut = string.find(nv, ',"resume":', 1, true)
if cut then nv = string.sub(nv, 1, cut - 1) .. '}' end
nv = (string.gsub(nv, '"lease_until":"[^"]*"', '"lease_until":"' .. ARGV[4] .. '"', 1))
nv = (string.gsub(nv, '"expires_at":"[^"]*"', '"expires_at":"' .. ARGV[4] .. '"', 1))
nv = string.sub(nv, 1, -2) .. ',"resume":' .. ARGV[2] .. '}'
redis.call('SET', KEYS[1], nv, 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[1] .. '\n' .. tostring(rec.payload_hash) .. '\n' .. ARGV[2], 'PX', 2 * tonumber(ARGV[3]))
return 1
"#;

/// release: ARGV = owner. The claim ended: its marker goes.
const RELEASE_TAIL: &str = r#"
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"#;

/// remove (forget): ARGV = the record as it was read (`""`: none). The record, whatever
/// its state, and its marker, if the record is still the one read; 1 when a record was
/// there, 0 when none was, -1 when the record changed since it was read (nothing deleted:
/// the store reads again). Conditional, so that a resend of an applied forget (the cluster
/// client resends a command whose connection broke after it left) finds a newer claim
/// made since, and leaves it.
const REMOVE: &str = r#"
local v = redis.call('GET', KEYS[1])
if (v or '') ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1], KEYS[2])
if v then return 1 end
return 0
"#;

fn script(tail: &str) -> LuaScript {
    LuaScript::new(format!("{GET}{CHECK}{tail}"))
}

struct Scripts {
    claim: LuaScript,
    finish: LuaScript,
    renew: LuaScript,
    mark_resume: LuaScript,
    release: LuaScript,
    remove: LuaScript,
}

impl Scripts {
    fn get() -> &'static Scripts {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(|| Scripts {
            claim: LuaScript::new(CLAIM),
            finish: LuaScript::new(format!("{GET}{FINISH_RESENT}{CHECK}{FINISH_TAIL}")),
            renew: script(RENEW_TAIL),
            mark_resume: script(MARK_RESUME_TAIL),
            release: script(RELEASE_TAIL),
            remove: LuaScript::new(REMOVE),
        })
    }
}

/// `d` in whole milliseconds for `PX`/`PEXPIRE`: at least 1 (Redis refuses `PX 0`) and at
/// most [`MAX_DURATION`] (Redis refuses an expiry past its clock's range: a longer lease or
/// record TTL, as a hand-built call can carry, would leave the claim unmade or the outcome
/// unrecorded, and the key free again once the lease lapsed).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.min(MAX_DURATION).as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn encode(record: &IdempotencyRecord) -> Result<String, Error> {
    serde_json::to_string(record).map_err(|e| Error::new(format!("record does not encode: {e}")))
}

/// The end of a lease of `lease` from now, as the exact text serde writes for the
/// record's timestamps (without the quotes).
fn lease_until(lease: Duration) -> Result<String, Error> {
    let until = chrono::Duration::from_std(lease)
        .ok()
        .and_then(|d| Utc::now().checked_add_signed(d))
        .unwrap_or(chrono::DateTime::<Utc>::MAX_UTC);
    let until = serde_json::to_string(&until)
        .map_err(|e| Error::new(format!("lease time does not encode: {e}")))?;
    Ok(until.trim_matches('"').to_owned())
}

/// A resume token as a JSON string, quotes included: the text the scripts splice into the
/// record.
fn token_json(token: &str) -> Result<String, Error> {
    serde_json::to_string(token).map_err(|e| Error::new(format!("token does not encode: {e}")))
}

fn decode(json: &str) -> Result<IdempotencyRecord, Error> {
    serde_json::from_str(json).map_err(|e| Error::new(format!("corrupt idempotency record: {e}")))
}

/// The lease marker of a record key: which owner holds (or last held, without finishing)
/// the claim, and for which payload digest. It lives one lease longer than the claim, so the next claim can tell a
/// takeover. `lease:` + the record key: the same hash tag (one slot), and never a record
/// key (those start with the layer's `idemp:`).
fn marker(key: &str) -> String {
    let mut m = String::with_capacity(6 + key.len());
    m.push_str("lease:");
    m.push_str(key);
    m
}

/// An [`IdempotencyStore`] in Redis: every process that points at the same Redis shares
/// the records, so a mutating call runs once across all of them.
///
/// Each operation is one round trip (see the crate docs for the key layout and the
/// scripts): `claim` is one Lua script (create the PENDING record if absent, and note its
/// owner in a lease marker that outlives it by one lease, so a claim over an expired one
/// is reported as a takeover, with the resume token the marker carries),
/// `finish`/`renew`/`mark_resume`/`release` are one owner-checked Lua script each (fenced
/// by the claim's own owner token),
/// `get` is one `GET`, `remove` a `GET` and a script that deletes the record only if it is
/// still the one read (so a resent forget never deletes a newer claim). Every operation is bounded by the connection's
/// operation timeout; a failure or timeout is a [`StoreError`], which the idempotency
/// layer turns into `STORE_UNAVAILABLE` (fail-closed) or a run without dedupe (fail-open).
///
/// Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct RedisIdempotencyStore {
    conn: RedisConnection,
}

impl RedisIdempotencyStore {
    /// A store on `conn`.
    pub fn new(conn: RedisConnection) -> Self {
        RedisIdempotencyStore { conn }
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
        let mark = marker(key);
        let mark = self.conn.key(&mark);
        let key = self.conn.key(key);
        let json = encode(&record)?;
        let own_token = match &record.resume {
            Some(token) => token_json(token)?,
            None => String::new(),
        };
        let ms = millis(lease);
        let digest = record.payload_hash.to_string();
        let reply: (i64, Option<String>) = self
            .conn
            .eval("claim", &Scripts::get().claim, |c| {
                c.arg(2)
                    .arg(&*key)
                    .arg(&*mark)
                    .arg(&json)
                    .arg(ms)
                    .arg(&record.owner)
                    .arg(ms.saturating_mul(2))
                    .arg(&own_token)
                    .arg(&digest);
            })
            .await?;
        match reply {
            (0, _) => Ok(ClaimOutcome::Claimed),
            // An expired claim made for another payload: the key is held for that payload,
            // shown as the lapsed claim (owner and digest of its marker), which the layer
            // answers as a key reused with another payload.
            (3, Some(marker)) => {
                let mut lines = marker.split('\n');
                let owner = lines.next().unwrap_or_default();
                let held = lines
                    .next()
                    .and_then(Digest::from_hex)
                    .ok_or_else(|| Error::new("corrupt lease marker: no payload digest"))?;
                Ok(ClaimOutcome::Existing(Arc::new(
                    IdempotencyRecord::pending(held, owner, lease),
                )))
            }
            (2, token) => Ok(ClaimOutcome::TakenOver {
                // Not a JSON string: not a token (the marker was written by someone else).
                resume: token.and_then(|t| serde_json::from_str::<String>(&t).ok()),
            }),
            (_, Some(json)) => {
                let there = decode(&json)?;
                // Our own PENDING record (the owner token is unique to this claim): a resend
                // of this claim found what its first send created (the cluster client
                // resends a command whose connection broke after it left). The claim is
                // ours; answering "held" would make the caller wait out its own lease. A
                // resume token on it that we did not send was carried from a claim the
                // first send took over: the claim is that takeover.
                if there.owner == record.owner && there.status == RecordStatus::Pending {
                    if record.resume.is_none() && there.resume.is_some() {
                        return Ok(ClaimOutcome::TakenOver {
                            resume: there.resume,
                        });
                    }
                    return Ok(ClaimOutcome::Claimed);
                }
                Ok(ClaimOutcome::Existing(Arc::new(there)))
            }
            (_, None) => Err(Error::new("claim script returned no record")),
        }
    }

    async fn finish_now(
        &self,
        key: &str,
        owner: &str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> Result<bool, Error> {
        if !record.is_finished() {
            return Err(Error::new("finish takes a COMPLETED or FAILED record"));
        }
        let mark = marker(key);
        let mark = self.conn.key(&mark);
        let key = self.conn.key(key);
        let json = encode(&record)?;
        let ms = millis(ttl);
        let done: i64 = self
            .conn
            .eval("record outcome", &Scripts::get().finish, |c| {
                c.arg(2)
                    .arg(&*key)
                    .arg(&*mark)
                    .arg(owner)
                    .arg(&json)
                    .arg(ms);
            })
            .await?;
        Ok(done == 1)
    }

    async fn renew_now(&self, key: &str, owner: &str, lease: Duration) -> Result<bool, Error> {
        let mark = marker(key);
        let mark = self.conn.key(&mark);
        let key = self.conn.key(key);
        let until = lease_until(lease)?;
        let ms = millis(lease);
        let done: i64 = self
            .conn
            .eval("renew", &Scripts::get().renew, |c| {
                c.arg(2)
                    .arg(&*key)
                    .arg(&*mark)
                    .arg(owner)
                    .arg(ms)
                    .arg(&until);
            })
            .await?;
        Ok(done == 1)
    }

    async fn mark_resume_now(
        &self,
        key: &str,
        owner: &str,
        token: &str,
        lease: Duration,
    ) -> Result<bool, Error> {
        check_resume_token(token).map_err(|e| Error::new(e.to_string()))?;
        let token = token_json(token)?;
        let mark = marker(key);
        let mark = self.conn.key(&mark);
        let key = self.conn.key(key);
        let until = lease_until(lease)?;
        let ms = millis(lease);
        let done: i64 = self
            .conn
            .eval("mark resume", &Scripts::get().mark_resume, |c| {
                c.arg(2)
                    .arg(&*key)
                    .arg(&*mark)
                    .arg(owner)
                    .arg(&token)
                    .arg(ms)
                    .arg(&until);
            })
            .await?;
        Ok(done == 1)
    }

    async fn release_now(&self, key: &str, owner: &str) -> Result<bool, Error> {
        let mark = marker(key);
        let mark = self.conn.key(&mark);
        let key = self.conn.key(key);
        let done: i64 = self
            .conn
            .eval("release", &Scripts::get().release, |c| {
                c.arg(2).arg(&*key).arg(&*mark).arg(owner);
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
        // A PENDING record changes when its owner renews it (every third of its lease):
        // a forget that finds it changed reads it again, a few times.
        for _ in 0..REMOVE_TRIES {
            let forget = self.read_for_forget(key).await?;
            if let Some(removed) = self.send_forget(&forget).await? {
                return Ok(removed);
            }
        }
        Err(Error::new(
            "forget: the record changed on every read; nothing was deleted",
        ))
    }

    /// The first half of a forget: the record under `key` as it is now.
    async fn read_for_forget(&self, key: &str) -> Result<Forget, Error> {
        let mark = marker(key);
        let full = self.conn.key(key).into_owned();
        let seen: Option<String> = self.conn.query("get", redis::cmd("GET").arg(&full)).await?;
        Ok(Forget {
            key: full,
            mark: self.conn.key(&mark).into_owned(),
            seen: seen.unwrap_or_default(),
        })
    }

    /// The second half: deletes the record and its marker if the record is still the one
    /// read. `Some(true)` when a record was deleted, `Some(false)` when there was none,
    /// `None` when it changed (nothing deleted). Sending the same `forget` again (a resend)
    /// never deletes a record written since it was read.
    async fn send_forget(&self, forget: &Forget) -> Result<Option<bool>, Error> {
        let n: i64 = self
            .conn
            .eval("remove", &Scripts::get().remove, |c| {
                c.arg(2)
                    .arg(&forget.key)
                    .arg(&forget.mark)
                    .arg(&forget.seen);
            })
            .await?;
        Ok(match n {
            1 => Some(true),
            0 => Some(false),
            _ => None,
        })
    }
}

/// How many times a forget reads a record that keeps changing before it gives up.
const REMOVE_TRIES: usize = 8;

/// A forget that has read the record: the full keys, and the record as read (`""`: none).
struct Forget {
    key: String,
    mark: String,
    seen: String,
}

fn store<T>(r: Result<T, Error>) -> Result<T, StoreError> {
    r.map_err(StoreError::from)
}

impl IdempotencyStore for RedisIdempotencyStore {
    /// The connection's [`op_timeout`](crate::RedisConfig::op_timeout): the layer refuses
    /// a lease that is not longer.
    fn op_timeout(&self) -> Option<Duration> {
        Some(self.conn.config().op_timeout)
    }

    fn claim<'a>(
        &'a self,
        key: &'a str,
        record: IdempotencyRecord,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move { store(self.claim_now(key, record, lease).await) })
    }

    fn finish<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move { store(self.finish_now(key, owner, record, ttl).await) })
    }

    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async move { store(self.renew_now(key, owner, lease).await) })
    }

    fn mark_resume<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move { store(self.mark_resume_now(key, owner, token, lease).await) })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{test_redis, unique_prefix};
    use crate::{RedisConfig, RedisConnection};
    use toolshield_idempotency::IdempotencyStore;

    /// A forget is applied but its reply is lost, and the cluster client resends it; in
    /// between, another call claims the key. The resend must leave the new claim alone:
    /// deleting it would let a third call claim the key while the second runs.
    #[tokio::test]
    async fn a_resent_forget_never_deletes_a_newer_claim() {
        let Some(redis) = test_redis("a_resent_forget_never_deletes_a_newer_claim") else {
            return;
        };
        let config = RedisConfig::from_url(redis.url()).with_key_prefix(unique_prefix());
        let s = RedisIdempotencyStore::new(RedisConnection::connect(config).await.expect("redis"));
        let key = "idemp:{pay}:-:g:forget-resend";
        let lease = Duration::from_secs(5);
        let hash = Digest::of_bytes(b"p");
        let first = IdempotencyRecord::pending(hash, "owner-1", lease);
        assert_eq!(
            s.claim(key, first, lease).await.unwrap(),
            ClaimOutcome::Claimed
        );

        let forget = s.read_for_forget(key).await.unwrap();
        assert_eq!(
            s.send_forget(&forget).await.unwrap(),
            Some(true),
            "forgotten"
        );
        let second = IdempotencyRecord::pending(hash, "owner-2", lease);
        assert_eq!(
            s.claim(key, second, lease).await.unwrap(),
            ClaimOutcome::Claimed
        );

        // The very same command again: the resend.
        assert_eq!(
            s.send_forget(&forget).await.unwrap(),
            None,
            "nothing deleted"
        );
        let rec = s
            .get(key)
            .await
            .unwrap()
            .expect("the newer claim is still there");
        assert!(rec.is_owned_by("owner-2"));
        // A forget sent now still clears it.
        assert!(s.remove(key).await.unwrap());
        assert_eq!(s.get(key).await.unwrap(), None);
        assert!(!s.remove(key).await.unwrap(), "nothing left to forget");
    }
}
