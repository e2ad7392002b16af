//! [`RedisBudgetStore`]: the call budgets of agent runs in Redis, shared by every process.

use std::fmt::Write as _;

use toolshield_budget::{BudgetStore, Charge, Limit, StoreError, StoreFuture, Verdict};

use crate::connection::{LuaScript, RedisConnection};
use crate::error::Error;
use toolshield_core::config::MAX_DURATION;

use crate::idempotency::millis;

/// Check-and-increment of one call, atomically: the tool's calls (field `t:<tool>`), the
/// run's calls (`#calls`) and cost (`#cost`) in one hash. ARGV: tool field, tool limit,
/// cost, run call limit, run cost limit (-1: none), TTL in ms. Returns 0 when admitted,
/// else the code of the limit that had no room (1 tool calls, 2 run calls, 3 run cost).
/// The TTL is refreshed either way: a run that keeps calling stays known.
///
/// Every check comes before the first write, and no write can fail: a counter that is not
/// the decimal integer the script writes (set by another client) is an error before any
/// write (the call counts for 18 digits, the most a call counter could reach, so `+1` never
/// overflows), the cost is added as
/// the exact integer text it came as (a Lua number would reach Redis as `1e+19` above
/// 2^53), and a total that would pass the largest integer Redis holds stays at that
/// integer, so a script never stops half-way with some counters increased.
const CHARGE: &str = r#"
local v = redis.call('HMGET', KEYS[1], ARGV[1], '#calls', '#cost')
local function count(x, digits)
  if not x then return 0 end
  if (x == '0' or string.match(x, '^[1-9]%d*$')) and #x <= digits then return tonumber(x) end
  return nil
end
local used = count(v[1], 18)
local calls = count(v[2], 18)
local spent = count(v[3], 19)
if not used or not calls or not spent then
  return redis.error_reply('budget counters hold a value toolshield did not write')
end
local max_tool = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local max_calls = tonumber(ARGV[4])
local max_cost = tonumber(ARGV[5])
local verdict = 0
if max_tool >= 0 and used >= max_tool then
  verdict = 1
elseif max_calls >= 0 and calls >= max_calls then
  verdict = 2
elseif max_cost >= 0 and spent + cost > max_cost then
  verdict = 3
else
  if cost > 0 then
    if spent + cost >= 9223372036854700000 then
      redis.call('HSET', KEYS[1], '#cost', '9223372036854775807')
    else
      redis.call('HINCRBY', KEYS[1], '#cost', ARGV[3])
    end
  end
  redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  redis.call('HINCRBY', KEYS[1], '#calls', 1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return verdict
"#;

fn charge_script() -> &'static LuaScript {
    static S: std::sync::OnceLock<LuaScript> = std::sync::OnceLock::new();
    S.get_or_init(|| LuaScript::new(CHARGE))
}

/// The Redis key of a run's budget (without the connection's prefix):
/// `{toolshield:budget:<key>}`, the encoded budget key with `%`, `{`, `}` and control
/// characters percent-encoded. The whole key is its own hash tag (one slot per run), and
/// the encoding is injective: no two runs share a key, whatever their ids contain.
///
/// ```
/// use toolshield_redis::budget_key;
///
/// assert_eq!(budget_key("r:run-1"), "{toolshield:budget:r:run-1}");
/// assert_eq!(budget_key("r:a}b{"), "{toolshield:budget:r:a%7Db%7B}");
/// assert_ne!(budget_key("r:%7D"), budget_key("r:}"));
/// ```
pub fn budget_key(key: &str) -> String {
    let mut s = String::with_capacity(key.len() + 24);
    s.push_str("{toolshield:budget:");
    for c in key.chars() {
        match c {
            '%' | '{' | '}' => {
                let _ = write!(s, "%{:02X}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(s, "%u{:X};", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('}');
    s
}

/// A [`BudgetStore`] in Redis: every process charging the same run shares its budget.
///
/// One hash per run under [`budget_key`] (after the connection's key prefix), holding the
/// calls of each tool (`t:<tool>`), the run's calls (`#calls`) and cost (`#cost`), with a
/// `PEXPIRE` of the run TTL refreshed by every charge. A charge is one round trip: one Lua
/// script that checks every limit and increments every counter, or none, atomically, so
/// concurrent calls from any number of replicas never exceed a limit. The hash is its own
/// hash tag, so a Redis Cluster serves each run from one slot.
///
/// A charge is bounded by the connection's operation timeout; a failure (Redis down,
/// paused, slow) is a [`StoreError`] that the ledger handles as configured
/// (`on_store_error`: reject with `STORE_UNAVAILABLE` by default, or allow uncounted). A
/// charge that timed out may still have been applied by Redis: the call then counted
/// without running, never the other way round.
///
/// Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct RedisBudgetStore {
    conn: RedisConnection,
}

impl RedisBudgetStore {
    /// A store on `conn`.
    pub fn new(conn: RedisConnection) -> Self {
        RedisBudgetStore { conn }
    }

    /// The connection.
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }

    async fn charge_now(&self, c: Charge<'_>) -> Result<Verdict, Error> {
        let key = budget_key(c.key);
        let key = self.conn.key(&key);
        let mut field = String::with_capacity(c.tool.len() + 2);
        field.push_str("t:");
        field.push_str(c.tool);
        let limit = |v: Option<u64>| v.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
        let cost = i64::try_from(c.cost).unwrap_or(i64::MAX);
        let code: i64 = self
            .conn
            .eval("budget charge", charge_script(), |cmd| {
                cmd.arg(1)
                    .arg(&*key)
                    .arg(&field)
                    .arg(limit(c.max_calls))
                    .arg(cost)
                    .arg(limit(c.run_max_calls))
                    .arg(limit(c.run_max_cost))
                    // Bounded: Redis refuses an expiry past its clock's range.
                    .arg(millis(c.ttl.min(MAX_DURATION)));
            })
            .await?;
        match code {
            0 => Ok(Verdict::Admitted),
            code => Limit::from_code(code)
                .map(Verdict::Exhausted)
                .ok_or_else(|| Error::new(format!("budget charge: unexpected answer {code}"))),
        }
    }
}

impl BudgetStore for RedisBudgetStore {
    fn charge<'a>(&'a self, charge: Charge<'a>) -> StoreFuture<'a, Verdict> {
        Box::pin(async move { self.charge_now(charge).await.map_err(StoreError::from) })
    }
}
