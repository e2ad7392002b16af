//! [`RedisRateLimitStore`]: the GCRA state of a rate limit shared by every replica.

use std::fmt::Write as _;
use std::time::Duration;

use toolshield_core::config::MAX_DURATION;
use toolshield_ratelimit::{Decision, RateLimit, RateLimitStore, Turn};
use toolshield_ratelimit::{StoreError, StoreFuture};

use crate::connection::{LuaScript, RedisConnection};
use crate::error::Error;

/// GCRA on the server's clock, in microseconds. KEYS[1] = the key's TAT;
/// ARGV = interval, tolerance, max wait. Returns `{admitted (1|0), wait, new TAT}`:
/// admitted calls move the TAT (kept until it has passed), rejected ones change nothing.
/// A key holding anything but the decimal integer this script writes (at most 16 digits:
/// exact in a Lua number) is an error, never a key without a reserved turn: a value
/// written by another client must not admit calls past the limit, nor be overwritten.
const ACQUIRE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local raw = redis.call('GET', KEYS[1])
local tat = nil
if raw then
  if not (raw == '0' or string.match(raw, '^[1-9]%d*$')) or #raw > 16 then
    return redis.error_reply('rate limit key holds a value toolshield did not write')
  end
  tat = tonumber(raw)
end
if tat == nil or tat < now then tat = now end
local wait = tat - tolerance - now
if wait < 0 then wait = 0 end
if wait > max_wait then return {0, wait, 0} end
local nxt = tat + interval
redis.call('SET', KEYS[1], string.format('%d', nxt), 'PX', math.floor((nxt - now) / 1000) + 1)
return {1, wait, nxt}
"#;

/// Gives one interval back (a waiting call was cancelled) if the call's turn is still
/// the last one reserved. KEYS[1] = the TAT; ARGV = interval, the TAT the call set.
const REFUND: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat ~= tonumber(ARGV[2]) then return 0 end
local nxt = tat - tonumber(ARGV[1])
if nxt <= now then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], string.format('%d', nxt), 'PX', math.floor((nxt - now) / 1000) + 1)
end
return 1
"#;

struct Scripts {
    acquire: LuaScript,
    refund: LuaScript,
}

fn scripts() -> &'static Scripts {
    static S: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    S.get_or_init(|| Scripts {
        acquire: LuaScript::new(ACQUIRE),
        refund: LuaScript::new(REFUND),
    })
}

/// The longest caller key stored under a Redis key of its own, in bytes (as in the
/// in-memory store); longer keys share their namespace's overflow key.
const MAX_KEY_LEN: usize = 4096;

/// Appends `part` with `%`, `{`, `}` and `|` percent-encoded (and control characters):
/// the result contains no brace (the hash tag stays whole) and no separator.
fn push_escaped(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' | '{' | '}' | '|' => {
                let _ = write!(out, "%{:02X}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "%u{:X};", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Microseconds, rounded up (an interval never shrinks, so the rate never grows).
fn micros_up(d: Duration) -> u64 {
    let us = d.as_micros() + u128::from(!d.subsec_nanos().is_multiple_of(1000));
    u64::try_from(us).unwrap_or(u64::MAX)
}

fn micros_down(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The GCRA state of a rate limit in Redis, shared by every replica that uses the same
/// `namespace`: the limit holds across processes.
///
/// Each decision is **one round trip**: one Lua script reads the key's time, decides on
/// the server's clock (`TIME`, so replicas' clocks need not agree) and reserves the call's
/// turn. The key is `toolshield:rl:{<namespace>|+<key>}` (`|-` for calls without a key,
/// `|*` shared by every key longer than 4 KiB),
/// namespace and key percent-encoded so no two distinct pairs share a key and the whole
/// key is one hash tag: it works on a Redis Cluster. A key lives until its time has
/// passed (at most the burst tolerance plus the longest wait), so Redis holds only the
/// keys active within that window.
///
/// A failed or timed-out operation ([`RedisConfig::op_timeout`](crate::RedisConfig::op_timeout))
/// is a store error; the layer fails open or closed as configured. A turn given back
/// by a cancelled waiter is sent in the background, and taken back only while no later
/// turn was reserved; a call cancelled during the round trip may leave its turn reserved
/// (the limit errs on the strict side).
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use toolshield_ratelimit::{RateLimit, RateLimitLayer, ByCaller};
/// use toolshield_redis::{RedisConfig, RedisConnection, RedisRateLimitStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let conn = RedisConnection::connect(RedisConfig::from_url("redis://127.0.0.1:6379")).await?;
/// let store = Arc::new(RedisRateLimitStore::new(conn, "search"));
/// let layer = RateLimitLayer::new(RateLimit::new(100, Duration::from_secs(60), 10))
///     .with_store(store)
///     .keyed(ByCaller);
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedisRateLimitStore {
    conn: RedisConnection,
    /// `toolshield:rl:{<namespace>|`, escaped.
    head: String,
}

impl RedisRateLimitStore {
    /// A store on `conn` for the limit named `namespace` (the tool, or any name the
    /// replicas agree on; limits with other names never share a key).
    #[must_use]
    pub fn new(conn: RedisConnection, namespace: &str) -> Self {
        let mut head = String::from("toolshield:rl:{");
        push_escaped(&mut head, namespace);
        head.push('|');
        RedisRateLimitStore { conn, head }
    }

    /// The connection.
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }

    /// The Redis key of `key` (before the connection's prefix).
    ///
    /// A key longer than 4 KiB is not stored as it is: every such key of
    /// this namespace shares one overflow key (`|*`), limited together as the in-memory
    /// store limits them, so a key chosen by a caller cannot make Redis hold keys of any
    /// length.
    #[must_use]
    pub fn storage_key(&self, key: Option<&str>) -> String {
        let mut s = String::with_capacity(
            self.head.len() + key.map_or(1, |k| k.len().min(MAX_KEY_LEN)) + 3,
        );
        s.push_str(&self.head);
        match key {
            Some(k) if k.len() > MAX_KEY_LEN => s.push('*'),
            Some(k) => {
                s.push('+');
                push_escaped(&mut s, k);
            }
            None => s.push('-'),
        }
        s.push('}');
        s
    }

    async fn acquire_now(
        &self,
        key: Option<&str>,
        limit: &RateLimit,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let storage = self.storage_key(key);
        let full = self.conn.key(&storage);
        let interval = micros_up(limit.interval());
        // Bounded by `MAX_DURATION` as the limit's own tolerance is, so a shared limit
        // admits the same burst as a local one; and a bounded wait, so the key's time
        // stays within `tolerance + max_wait + interval` of now: exact in a Lua number,
        // and a valid `PX`.
        let tolerance = interval
            .saturating_mul(u64::from(limit.burst().saturating_sub(1)))
            .min(micros_down(MAX_DURATION));
        let max_wait = max_wait.min(MAX_DURATION);
        let (admitted, wait, tat): (i64, i64, i64) = self
            .conn
            .eval("rate limit", &scripts().acquire, |c| {
                c.arg(1)
                    .arg(&*full)
                    .arg(interval)
                    .arg(tolerance)
                    .arg(micros_down(max_wait));
            })
            .await?;
        let wait = Duration::from_micros(u64::try_from(wait).unwrap_or(0));
        Ok(if admitted == 1 {
            Decision::Admit {
                wait,
                turn: Turn::Mark(tat),
            }
        } else {
            Decision::Reject { retry_after: wait }
        })
    }
}

impl RateLimitStore for RedisRateLimitStore {
    fn acquire<'a>(
        &'a self,
        key: Option<&'a str>,
        limit: &'a RateLimit,
        max_wait: Duration,
    ) -> StoreFuture<'a, Decision> {
        Box::pin(async move {
            self.acquire_now(key, limit, max_wait)
                .await
                .map_err(StoreError::from)
        })
    }

    fn refund(&self, key: Option<&str>, limit: &RateLimit, turn: Turn) {
        let Turn::Mark(tat) = turn else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let conn = self.conn.clone();
        let full = conn.key(&self.storage_key(key)).into_owned();
        let interval = micros_up(limit.interval());
        handle.spawn(async move {
            let r: Result<i64, Error> = conn
                .eval("rate limit refund", &scripts().refund, |c| {
                    c.arg(1).arg(&*full).arg(interval).arg(tat);
                })
                .await;
            if let Err(e) = r {
                tracing::debug!(target: "toolshield::ratelimit", error = %e, "refund not sent");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_are_injective_and_one_hash_tag() {
        let conn =
            RedisConnection::connect_lazy(crate::RedisConfig::from_url("redis://127.0.0.1:1"))
                .expect("lazy connection");
        let a = RedisRateLimitStore::new(conn.clone(), "search");
        let b = RedisRateLimitStore::new(conn, "search|+x");
        assert_eq!(
            a.storage_key(Some("alice")),
            "toolshield:rl:{search|+alice}"
        );
        assert_eq!(a.storage_key(None), "toolshield:rl:{search|-}");
        assert_ne!(a.storage_key(Some("-")), a.storage_key(None));
        assert_ne!(a.storage_key(Some("x|+y")), b.storage_key(Some("y")));
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(
            a.storage_key(Some(&long)),
            "toolshield:rl:{search|*}",
            "a key past the bound shares the overflow key"
        );
        assert_eq!(
            a.storage_key(Some(&long[..MAX_KEY_LEN])),
            format!("toolshield:rl:{{search|+{}}}", &long[..MAX_KEY_LEN])
        );
        assert_ne!(a.storage_key(Some("*")), a.storage_key(Some(&long)));
        let hostile = a.storage_key(Some("}{evil}"));
        assert_eq!(hostile.matches('{').count(), 1);
        assert_eq!(hostile.matches('}').count(), 1);
        assert!(hostile.ends_with('}'));
    }

    #[test]
    fn intervals_round_up_to_microseconds() {
        assert_eq!(micros_up(Duration::from_nanos(333_333_334)), 333_334);
        assert_eq!(micros_up(Duration::from_millis(100)), 100_000);
        assert_eq!(micros_down(Duration::from_nanos(1_999)), 1);
    }
}
