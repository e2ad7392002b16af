//! [`SharedBreakerState`]: breaker open-state shared between processes through Redis.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use toolshield_breaker::{BreakerRegistry, CircuitState, SharedOpenState, TransitionReason};
use toolshield_core::config::{deadline_after, MAX_DURATION};

use crate::connection::{LuaScript, RedisConnection};
use crate::error::Error;
use crate::idempotency::millis;

/// Records `key` open for ARGV[2] ms (on the server's clock) in the registry's hash and
/// announces it. KEYS[1] = `breaker:{name}`; ARGV = key, wait ms, origin, channel.
/// Fields whose open period has ended are deleted first: the hash holds only the keys
/// open now, however long openings keep its TTL moving. A value of another type in its
/// place (written by another client) is replaced: sharing resumes with this opening.
const PUBLISH: &str = r#"
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', KEYS[1]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait = tonumber(ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local sep = string.find(all[i + 1], '|', 1, true)
  if not sep or (tonumber(string.sub(all[i + 1], 1, sep - 1)) or 0) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now + wait) .. '|' .. ARGV[3])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < wait then redis.call('PEXPIRE', KEYS[1], wait) end
redis.call('PUBLISH', ARGV[4], ARGV[3] .. '\n' .. wait .. '\n' .. ARGV[1])
return 1
"#;

/// Deletes `key`'s opening from the registry's hash and announces that an operator reset
/// it. KEYS[1] = `breaker:{name}`; ARGV = key, origin, channel.
const CLEAR: &str = r#"
if redis.call('TYPE', KEYS[1]).ok == 'hash' then redis.call('HDEL', KEYS[1], ARGV[1]) end
redis.call('PUBLISH', ARGV[3], ARGV[2] .. '\n' .. 'reset' .. '\n' .. ARGV[1])
return 1
"#;

/// The middle line of a message announcing a manual reset (an opening's is its wait in
/// milliseconds).
const RESET: &str = "reset";

/// Every key still open, with its time left (server clock) and who opened it:
/// `[key, ms, origin, ...]`. Expired fields are deleted on the way. A value of another
/// type in the hash's place holds no opening.
const SNAPSHOT: &str = r#"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return {} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local sep = string.find(all[i + 1], '|', 1, true)
  local left = (tonumber(string.sub(all[i + 1], 1, (sep or 0) - 1)) or 0) - now
  if sep and left > 0 then
    out[#out + 1] = all[i]
    out[#out + 1] = string.format('%d', left)
    out[#out + 1] = string.sub(all[i + 1], sep + 1)
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
"#;

struct Scripts {
    publish: LuaScript,
    clear: LuaScript,
    snapshot: LuaScript,
}

fn scripts() -> &'static Scripts {
    static S: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    S.get_or_init(|| Scripts {
        publish: LuaScript::new(PUBLISH),
        clear: LuaScript::new(CLEAR),
        snapshot: LuaScript::new(SNAPSHOT),
    })
}

/// The local view of keys opened elsewhere: what the breakers ask on their hot path.
#[derive(Default)]
struct OpenElsewhere {
    /// Entries in `until` (possibly expired): zero means nothing to look up.
    live: AtomicUsize,
    until: RwLock<HashMap<Arc<str>, Instant>>,
}

impl OpenElsewhere {
    fn open(&self, key: &str, wait: Duration) {
        // `wait` comes from another process: saturate rather than overflow the clock.
        let until = deadline_after(Instant::now(), wait);
        let mut map = self.until.write().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, t| *t > now);
        let slot = map.entry(Arc::from(key)).or_insert(until);
        if *slot < until {
            *slot = until;
        }
        self.live.store(map.len(), Ordering::Release);
    }

    /// Forgets what other processes said of `key`.
    fn clear(&self, key: &str) {
        if self.live.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut map = self.until.write().unwrap_or_else(|e| e.into_inner());
        map.remove(key);
        self.live.store(map.len(), Ordering::Release);
    }
}

thread_local! {
    /// Set while this thread applies a reset announced by another process, so the reset
    /// event it raises is not announced again.
    static APPLYING_REMOTE_RESET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Resets `key` in `registry` because another process's operator reset it: only a
/// breaker this process tripped (open or half-open) is reset; a closed breaker has
/// nothing to reset and an override set here stays.
fn apply_remote_reset(registry: &BreakerRegistry, local: &OpenElsewhere, key: &str) {
    local.clear(key);
    let tripped = matches!(
        registry.state(key),
        CircuitState::Open | CircuitState::HalfOpen
    );
    if tripped {
        let _applying = ApplyingRemoteReset::start();
        registry.reset(key);
    }
}

/// Marks this thread as applying a remote reset until dropped (also when a breaker
/// callback unwinds through the reset).
struct ApplyingRemoteReset;

impl ApplyingRemoteReset {
    fn start() -> Self {
        APPLYING_REMOTE_RESET.with(|f| f.set(true));
        ApplyingRemoteReset
    }
}

impl Drop for ApplyingRemoteReset {
    fn drop(&mut self) {
        APPLYING_REMOTE_RESET.with(|f| f.set(false));
    }
}

impl SharedOpenState for OpenElsewhere {
    #[inline]
    fn open_for(&self, key: &str) -> Option<Duration> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let map = self.until.read().unwrap_or_else(|e| e.into_inner());
        let until = *map.get(key)?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }
}

/// Shares the open-state of a [`BreakerRegistry`] with every process that attaches a
/// registry under the same name to the same Redis.
///
/// - When a breaker of this registry **opens** (automatically: consecutive failures,
///   failure rate, slow calls, a failed probe; not by a manual override, not in
///   metrics-only mode), a background task records `key open for W` in the hash
///   `breaker:{name}` (on the server's clock) and publishes it on the channel
///   `toolshield:breaker:{name}`. One round trip per opening, off the call path.
/// - A background task subscribed to that channel keeps a local map of keys opened
///   elsewhere, seeded from the hash when it (re)subscribes, so a process that starts
///   during an open period learns of it too.
/// - A closed breaker about to admit a call checks that local map (an atomic load while
///   nothing is open elsewhere; a read lock and a hash lookup while something is) and
///   rejects with `CIRCUIT_OPEN` until the remote open period ends. Its local counts and
///   state are untouched: the local breaker keeps judging only what it sees. **No Redis
///   round trip on the call path.**
/// - A manual [`reset`](BreakerRegistry::reset) (or `reset_all`, or the admin API's
///   reset) reaches every process: this process forgets at once what others said of the
///   key, the key's opening is deleted from the hash, and every other process forgets it
///   too and resets its own breaker of the key if that breaker is open or half-open. An
///   override set in another process (forced open or closed, metrics-only) stays; the
///   other overrides are local to the process they are set in.
///
/// Times travel as durations measured on the Redis server's clock, so machines' clocks
/// need not agree. The open period a process applies is the remaining wait when the
/// message arrives (pub/sub delivery is typically well under a millisecond).
///
/// If Redis is unreachable, breakers simply stop sharing: each process keeps its own
/// state; the subscriber reconnects with backoff and re-reads the hash. Dropping the
/// handle stops both tasks (the registry then only sees what it is told locally).
pub struct SharedBreakerState {
    name: String,
    local: Arc<OpenElsewhere>,
    tasks: Vec<JoinHandle<()>>,
}

impl fmt::Debug for SharedBreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBreakerState")
            .field("name", &self.name)
            .field("open_elsewhere", &self.local.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for SharedBreakerState {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn origin_id() -> String {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{nanos:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl SharedBreakerState {
    /// Attaches `registry` under `name` (every process whose registry should share
    /// open-state uses the same name) to the Redis of `conn`, and waits until the
    /// subscription is live (at most the connect timeout). Must be called inside a tokio
    /// runtime; keep the returned handle alive as long as sharing should go on.
    ///
    /// Fails when the registry already shares its state, when `name` contains a brace,
    /// or when Redis cannot be subscribed to in time.
    pub async fn attach(
        registry: &BreakerRegistry,
        conn: RedisConnection,
        name: &str,
    ) -> Result<Self, Error> {
        if name.contains(['{', '}']) {
            return Err(Error::new("registry name must not contain `{` or `}`"));
        }
        let hash = conn.key(&format!("breaker:{{{name}}}")).into_owned();
        let channel = format!("toolshield:{hash}");
        let origin = origin_id();
        let local = Arc::new(OpenElsewhere::default());

        let (ready_tx, ready_rx) = oneshot::channel();
        let subscriber = tokio::spawn(subscribe_loop(
            conn.clone(),
            registry.clone(),
            hash.clone(),
            channel.clone(),
            origin.clone(),
            Arc::clone(&local),
            Some(ready_tx),
        ));
        let within = conn.config().connect_timeout;
        match tokio::time::timeout(within, ready_rx).await {
            Ok(Ok(())) => {}
            _ => {
                subscriber.abort();
                return Err(Error::timeout("breaker subscription", within));
            }
        }

        if !registry.share_open_state(Arc::clone(&local) as Arc<dyn SharedOpenState>) {
            subscriber.abort();
            return Err(Error::new("the registry already shares its open-state"));
        }
        let (tx, rx) = mpsc::unbounded_channel::<Announce>();
        let on_reset = Arc::clone(&local);
        registry.on_event(move |ev| {
            if ev.to == CircuitState::Open && !ev.shadow && !ev.reason.is_manual() {
                let _ = tx.send(Announce::Opened(Arc::clone(&ev.key)));
            } else if ev.reason == TransitionReason::Reset {
                // This process admits at once; the others when the announcement arrives.
                on_reset.clear(&ev.key);
                if !APPLYING_REMOTE_RESET.with(std::cell::Cell::get) {
                    let _ = tx.send(Announce::Reset(Arc::clone(&ev.key)));
                }
            }
        });
        let publisher = tokio::spawn(publish_loop(
            conn,
            registry.clone(),
            rx,
            hash,
            channel,
            origin,
        ));
        Ok(SharedBreakerState {
            name: name.to_owned(),
            local,
            tasks: vec![subscriber, publisher],
        })
    }

    /// The registry name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How much longer `key` is open in another process, as this process knows it.
    pub fn open_elsewhere(&self, key: &str) -> Option<Duration> {
        self.local.open_for(key)
    }
}

/// What this process announces to the others.
enum Announce {
    /// A breaker of this process opened.
    Opened(Arc<str>),
    /// An operator reset a breaker of this process.
    Reset(Arc<str>),
}

async fn publish_loop(
    conn: RedisConnection,
    registry: BreakerRegistry,
    mut rx: mpsc::UnboundedReceiver<Announce>,
    hash: String,
    channel: String,
    origin: String,
) {
    while let Some(announce) = rx.recv().await {
        let key = match announce {
            Announce::Opened(key) => key,
            Announce::Reset(key) => {
                let r: Result<i64, Error> = conn
                    .eval("breaker reset", &scripts().clear, |c| {
                        c.arg(1).arg(&hash).arg(&*key).arg(&origin).arg(&channel);
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(key = %key, error = %e, "breaker: could not share a reset");
                }
                continue;
            }
        };
        let Some(wait) = registry.status(&key).and_then(|s| s.time_until_half_open) else {
            continue;
        };
        if wait.is_zero() {
            continue;
        }
        // Bounded, so the server's `now + wait` and `PEXPIRE` stay in range.
        let ms = millis(wait.min(MAX_DURATION));
        let r: Result<i64, Error> = conn
            .eval("breaker publish", &scripts().publish, |c| {
                c.arg(1)
                    .arg(&hash)
                    .arg(&*key)
                    .arg(ms)
                    .arg(&origin)
                    .arg(&channel);
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(key = %key, error = %e, "breaker: could not share an open circuit");
        }
    }
}

async fn subscribe_loop(
    conn: RedisConnection,
    registry: BreakerRegistry,
    hash: String,
    channel: String,
    origin: String,
    local: Arc<OpenElsewhere>,
    mut ready: Option<oneshot::Sender<()>>,
) {
    let mut backoff = Duration::from_millis(50);
    let max = conn.config().reconnect_max_delay;
    let mut attempt = 0usize;
    loop {
        // On a cluster, each attempt tries the next seed node.
        let url = conn.subscription_url(attempt);
        attempt = attempt.wrapping_add(1);
        let on = Subscription {
            conn: &conn,
            registry: &registry,
            hash: &hash,
            channel: &channel,
            origin: &origin,
            local: &local,
        };
        match subscribe_once(&on, url, &mut ready).await {
            Ok(()) => backoff = Duration::from_millis(50),
            Err(e) => {
                tracing::warn!(error = %e, "breaker: shared open-state subscription lost; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2).min(max);
    }
}

/// What a subscription works on.
struct Subscription<'a> {
    conn: &'a RedisConnection,
    registry: &'a BreakerRegistry,
    hash: &'a str,
    channel: &'a str,
    origin: &'a str,
    local: &'a OpenElsewhere,
}

/// One subscription: subscribe, read the hash, then apply messages until the connection
/// ends. `Ok` when it ended after having worked.
async fn subscribe_once(
    on: &Subscription<'_>,
    url: &str,
    ready: &mut Option<oneshot::Sender<()>>,
) -> Result<(), Error> {
    let Subscription {
        conn,
        registry,
        hash,
        channel,
        origin,
        local,
    } = *on;
    let within = conn.config().connect_timeout;
    let client = redis::Client::open(url).map_err(|e| Error::redis("breaker subscription", &e))?;
    let mut pubsub = match tokio::time::timeout(within, async {
        let mut p = client.get_async_pubsub().await?;
        p.subscribe(channel).await?;
        Ok::<_, redis::RedisError>(p)
    })
    .await
    {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return Err(Error::redis("breaker subscription", &e)),
        Err(_) => return Err(Error::timeout("breaker subscription", within)),
    };
    // Subscribed first, then read: an opening published in between is seen twice, never
    // missed.
    let open: Vec<String> = conn
        .eval("breaker snapshot", &scripts().snapshot, |c| {
            c.arg(1).arg(hash);
        })
        .await?;
    for entry in open.chunks_exact(3) {
        if entry[2] == origin {
            continue;
        }
        if let Ok(ms) = entry[1].parse::<u64>() {
            local.open(&entry[0], Duration::from_millis(ms));
        }
    }
    if let Some(tx) = ready.take() {
        let _ = tx.send(());
    }
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        let Ok(text) = msg.get_payload::<String>() else {
            continue;
        };
        let mut parts = text.splitn(3, '\n');
        let (Some(from), Some(ms), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ms == RESET {
            if from == origin {
                // This process's own reset, in the channel's order: an opening another
                // process announced before it, and delivered since, is forgotten too.
                local.clear(key);
            } else {
                apply_remote_reset(registry, local, key);
            }
            continue;
        }
        if from == origin {
            continue;
        }
        if let Ok(ms) = ms.parse::<u64>() {
            local.open(key, Duration::from_millis(ms));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_open_period_from_a_peer_longer_than_the_clock_allows_is_saturated() {
        let local = OpenElsewhere::default();
        local.open("k", Duration::MAX);
        local.open("k2", Duration::from_millis(u64::MAX));
        for key in ["k", "k2"] {
            let left = local.open_for(key).expect("open");
            assert!(left <= MAX_DURATION, "{left:?}");
            assert!(left > MAX_DURATION - Duration::from_secs(60), "{left:?}");
        }
    }
}
