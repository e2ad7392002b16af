//! Exactly-once across replicas under random faults, checked by invariants over many seeds.
//!
//! Per seed: three replicas (each its own idempotency layer, store and Redis connection, as
//! three processes would have) share one private, persistent `redis-server`. Callers send
//! duplicates of six mutations at random moments through random replicas; a seeded plan
//! pauses Redis (`SIGSTOP`/`SIGCONT`) or kills and restarts it (append-only file, so no
//! acknowledged write is lost) at random moments, drops some callers' futures at a random
//! point, and makes the tool succeed, fail (retriable or not), time out after its effect or
//! panic after its effect. Every outage is shorter than a third of the lease, so the one
//! documented way for a key to run twice (a store that takes nothing for a whole lease) is
//! never reached: any second effect is a defect. Then, with Redis healthy, each replica
//! sends one more duplicate of every key. The checker asserts:
//!
//! 1. each key's tool side effect happened at most once;
//! 2. no caller gets another key's answer, and every success is the one the tool produced
//!    for that key;
//! 3. once a caller got a recorded success, every duplicate sent later gets that same
//!    answer (or `STORE_UNAVAILABLE` while Redis is down);
//! 4. an effect whose answer could not be recorded (a timeout or a panic after the effect,
//!    a caller dropped mid-call) leaves the key `OUTCOME_UNKNOWN`, never free;
//! 5. every answer is of a documented kind, and no caller hangs;
//! 6. no PENDING record outlives its lease (its expiry is at most one lease away, and it is
//!    gone once a lease has passed).
//!
//! On a violation the seed and a compact trace of the seed are printed.
//!
//! Real time, not tokio's paused clock: the faults are a real server stopped, killed and
//! restarted, whose key expiry runs on its own clock, and the store's operation timeout
//! must fire against a real socket. The timings (lease 3 s, outages ≤ 450 ms, operation
//! timeout 300 ms) leave wide margins for a loaded 2-core CI machine.
//!
//! `TOOLSHIELD_SEED=<n>` runs that one seed (the plan is the seed's; the interleaving of
//! real time is not exactly reproducible, which is why the trace is printed).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use common::{connect, prefix, stack, Stack};
use serde_json::{json, Value};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{storage_key, IdempotencyConfig, OnPending, OnStoreError};
use toolshield_redis::testing::{private_persistent_redis, RedisServer};
use toolshield_redis::RedisIdempotencyStore;
use toolshield_test::Rng;
use tower::{service_fn, ServiceExt};

const SEEDS: u64 = 10;
const REPLICAS: usize = 3;
const KEYS: usize = 6;
const DUPLICATES: usize = 6;
/// Callers of a seed start within this window.
const WINDOW_MS: u64 = 1_500;
const LEASE: Duration = Duration::from_secs(3);
const OP_TIMEOUT: Duration = Duration::from_millis(300);
/// The longest a fault keeps Redis from answering.
const MAX_OUTAGE_MS: u64 = 450;
/// How long after an outage a store error is still put down to it.
const RECONNECT_GRACE: Duration = Duration::from_secs(2);
/// No caller may take longer than this.
const CALLER_BOUND: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy)]
enum Behaviour {
    /// Effect, then success.
    Ok,
    /// No effect, a retriable failure (frees the key).
    Unavailable,
    /// No effect, a non-retriable failure (replayed for `failed_ttl`).
    Fails,
    /// Effect, then a timeout (ends `OUTCOME_UNKNOWN`).
    TimesOut,
    /// Effect, then a panic (ends `OUTCOME_UNKNOWN`).
    Panics,
}

impl Behaviour {
    fn has_effect(self) -> bool {
        matches!(
            self,
            Behaviour::Ok | Behaviour::TimesOut | Behaviour::Panics
        )
    }
}

/// What the checker knows of one key.
#[derive(Debug, Default, Clone)]
struct KeyLog {
    /// Tool runs started, with or without effect.
    started: u32,
    effects: u32,
    /// The answer of the tool run that succeeded.
    tool_ok: Option<Value>,
    /// A run failed without effect, non-retriably.
    failed: bool,
    /// A run panicked.
    panicked: bool,
    /// When a caller got a success that was recorded (not `unrecorded`).
    recorded_at: Option<StdInstant>,
}

struct Ledger {
    seed: u64,
    start: StdInstant,
    trace: Vec<String>,
    keys: Vec<KeyLog>,
    violations: Vec<String>,
    /// When Redis was last down (pause or kill) and when it answered again.
    outages: Vec<(StdInstant, Option<StdInstant>)>,
    executions: u64,
}

impl Ledger {
    fn new(seed: u64) -> Self {
        Ledger {
            seed,
            start: StdInstant::now(),
            trace: Vec::new(),
            keys: vec![KeyLog::default(); KEYS],
            violations: Vec::new(),
            outages: Vec::new(),
            executions: 0,
        }
    }

    fn log(&mut self, what: String) {
        let t = self.start.elapsed().as_millis();
        self.trace.push(format!("{t:>6}ms {what}"));
    }

    fn violation(&mut self, what: String) {
        self.log(format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    /// Whether Redis was down at any moment of `[from, to]`, or came back shortly before
    /// `from`: the first command a connection sends after an outage may still fail.
    fn down_during(&self, from: StdInstant, to: StdInstant) -> bool {
        let from = from.checked_sub(RECONNECT_GRACE).unwrap_or(from);
        self.outages
            .iter()
            .any(|&(down, up)| down <= to && up.is_none_or(|up| up >= from))
    }
}

type Shared = Arc<Mutex<Ledger>>;

fn lock(l: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

fn key_name(k: usize) -> String {
    format!("order-{k}")
}

fn request(k: usize) -> ToolRequest {
    ToolRequest::new("pay", json!({"order": k, "amount": 42}))
        .kind(CallKind::Mutating)
        .idempotency_key(key_name(k))
}

/// The tool of replica `r`: picks a behaviour from the seed's generator, counts effects.
fn tool(r: usize, ledger: &Shared, rng: &Arc<Mutex<Rng>>) -> Stack {
    let ledger = Arc::clone(ledger);
    let rng = Arc::clone(rng);
    let svc = service_fn(move |req: ToolRequest| {
        let ledger = Arc::clone(&ledger);
        let k = req.payload()["order"].as_u64().unwrap_or(u64::MAX) as usize;
        let (behaviour, work) = {
            let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
            let b = match rng.below(20) {
                0..=10 => Behaviour::Ok,
                11..=13 => Behaviour::Unavailable,
                14..=15 => Behaviour::Fails,
                16..=18 => Behaviour::TimesOut,
                _ => Behaviour::Panics,
            };
            (b, rng.millis(400))
        };
        let exec = {
            let mut l = lock(&ledger);
            l.executions += 1;
            let exec = l.executions;
            if k < KEYS {
                l.keys[k].started += 1;
            }
            if k < KEYS && behaviour.has_effect() {
                l.keys[k].effects += 1;
                if l.keys[k].effects > 1 {
                    let n = l.keys[k].effects;
                    l.violation(format!(
                        "k{k}: side effect number {n} (exec {exec} on r{r})"
                    ));
                }
            }
            l.log(format!("k{k} exec {exec} on r{r}: {behaviour:?}, {work:?}"));
            exec
        };
        Box::pin(async move {
            tokio::time::sleep(work).await;
            let mut l = lock(&ledger);
            if k >= KEYS {
                l.violation(format!("r{r} ran a request of no known key"));
                return Err(ToolError::internal("unknown key"));
            }
            match behaviour {
                Behaviour::Ok => {
                    let out = json!({"order": k, "exec": exec, "by": r});
                    l.keys[k].tool_ok = Some(out.clone());
                    l.log(format!("k{k} exec {exec} answered ok"));
                    Ok(ToolResponse::new(out))
                }
                Behaviour::Unavailable => Err(ToolError::new(
                    ErrorKind::UpstreamUnavailable,
                    format!("exec {exec} unavailable"),
                )),
                Behaviour::Fails => {
                    l.keys[k].failed = true;
                    Err(ToolError::execution_failed(format!("exec {exec} failed")))
                }
                Behaviour::TimesOut => Err(ToolError::timeout(format!("exec {exec} timed out"))),
                Behaviour::Panics => {
                    l.keys[k].panicked = true;
                    l.log(format!("k{k} exec {exec} panics"));
                    drop(l);
                    panic!("tool bug in exec {exec}");
                }
            }
        })
    });
    tower::util::BoxCloneService::new(svc)
}

/// One caller's answer as the checker sees it.
#[derive(Debug)]
enum Answer {
    Ok(ToolResponse),
    Err(ToolError),
    Panicked,
    Dropped,
    Hung,
}

fn describe(a: &Answer) -> String {
    match a {
        Answer::Ok(r) => format!(
            "ok {} replayed={} unrecorded={}",
            r.output, r.provenance.replayed, r.provenance.unrecorded
        ),
        Answer::Err(e) => format!("{}", e.kind()),
        Answer::Panicked => "panicked".into(),
        Answer::Dropped => "dropped".into(),
        Answer::Hung => "hung".into(),
    }
}

/// Sends one duplicate of key `k` through `svc`, dropping its future after `drop_after`.
async fn send(svc: Stack, k: usize, drop_after: Option<Duration>) -> Answer {
    let mut task = tokio::spawn(svc.oneshot(request(k)));
    let bound = drop_after.unwrap_or(CALLER_BOUND);
    tokio::select! {
        joined = &mut task => match joined {
            Ok(Ok(resp)) => Answer::Ok(resp),
            Ok(Err(e)) => Answer::Err(e),
            Err(e) if e.is_panic() => Answer::Panicked,
            Err(_) => Answer::Hung,
        },
        () = tokio::time::sleep(bound) => {
            task.abort();
            if drop_after.is_some() { Answer::Dropped } else { Answer::Hung }
        }
    }
}

/// Checks one answer of key `k` sent at `sent`; `last` marks the final phase (Redis
/// healthy, no caller dropped).
fn check(l: &mut Ledger, who: &str, k: usize, sent: StdInstant, a: &Answer, last: bool) {
    let now = StdInstant::now();
    l.log(format!("{who} k{k} <- {}", describe(a)));
    let log = l.keys[k].clone();
    let outage = l.down_during(sent, now);
    // 3: a duplicate sent after a recorded success gets that success.
    if let Some(at) = log.recorded_at {
        let store_down = matches!(a, Answer::Err(e) if e.kind() == ErrorKind::StoreUnavailable);
        if sent > at && !matches!(a, Answer::Ok(_) | Answer::Dropped) && !(store_down && outage) {
            l.violation(format!(
                "{who} k{k}: sent after a recorded success, got {}",
                describe(a)
            ));
        }
    }
    match a {
        Answer::Ok(resp) => {
            // 2: never another key's answer, only the tool's own success for this key.
            if resp.output["order"] != json!(k) {
                l.violation(format!(
                    "{who} k{k}: got another key's answer {}",
                    resp.output
                ));
            } else if log.tool_ok.as_ref() != Some(&resp.output) {
                l.violation(format!(
                    "{who} k{k}: got {} but the tool's success was {:?}",
                    resp.output, log.tool_ok
                ));
            }
            if !resp.provenance.unrecorded && l.keys[k].recorded_at.is_none() {
                l.keys[k].recorded_at = Some(now);
            }
        }
        Answer::Err(e) => {
            let kind = e.kind();
            let ok = match kind {
                ErrorKind::StoreUnavailable => !last || outage,
                ErrorKind::InProgress => !last,
                // A mutation dropped or abandoned while it ran may have taken effect.
                ErrorKind::OutcomeUnknown => log.started > 0,
                ErrorKind::UpstreamUnavailable => true,
                ErrorKind::ExecutionFailed => log.failed,
                _ => false,
            };
            if !ok {
                l.violation(format!("{who} k{k}: unexpected {kind}: {}", e.message()));
            }
            // 4: in the final phase, an effect without a recorded success is OUTCOME_UNKNOWN
            // (checked in `final_phase` for a key that succeeded).
            if last && log.effects > 0 && log.tool_ok.is_none() && kind != ErrorKind::OutcomeUnknown
            {
                l.violation(format!(
                    "{who} k{k}: the effect happened, yet a late duplicate got {kind}"
                ));
            }
        }
        Answer::Panicked => {
            if !log.panicked || last {
                l.violation(format!("{who} k{k}: a caller panicked"));
            }
        }
        Answer::Dropped => {}
        Answer::Hung => l.violation(format!("{who} k{k}: no answer within {CALLER_BOUND:?}")),
    }
}

/// A fault of the plan: at `at` ms, Redis is paused or killed for `for_ms`.
#[derive(Debug, Clone, Copy)]
struct Fault {
    at: u64,
    kill: bool,
    for_ms: u64,
}

fn plan(rng: &mut Rng) -> Vec<Fault> {
    let mut faults = Vec::new();
    let mut at = rng.below(300);
    while at < WINDOW_MS + 1_000 {
        let fault = Fault {
            at,
            kill: rng.below(2) == 0,
            for_ms: 80 + rng.below(MAX_OUTAGE_MS - 80),
        };
        faults.push(fault);
        // Always a full lease's third of health between two faults: a renewal can land.
        at += fault.for_ms + 1_000 + rng.below(800);
    }
    faults
}

/// Applies `faults` to `redis` on a thread of its own (kill and restart block).
fn inject(
    mut redis: RedisServer,
    faults: Vec<Fault>,
    ledger: Shared,
) -> std::thread::JoinHandle<RedisServer> {
    std::thread::spawn(move || {
        let start = lock(&ledger).start;
        for f in faults {
            let at = start + Duration::from_millis(f.at);
            std::thread::sleep(at.saturating_duration_since(StdInstant::now()));
            let idx = {
                let mut l = lock(&ledger);
                l.outages.push((StdInstant::now(), None));
                let what = if f.kill { "kill" } else { "pause" };
                l.log(format!("FAULT redis {what} for {}ms", f.for_ms));
                l.outages.len() - 1
            };
            if f.kill {
                redis.kill();
                std::thread::sleep(Duration::from_millis(f.for_ms));
                if let Err(e) = redis.restart() {
                    lock(&ledger).violation(format!("redis did not restart: {e}"));
                }
            } else {
                redis.pause();
                std::thread::sleep(Duration::from_millis(f.for_ms));
                redis.resume();
            }
            let mut l = lock(&ledger);
            l.outages[idx].1 = Some(StdInstant::now());
            l.log("FAULT over: redis answers".into());
        }
        redis
    })
}

/// The PENDING records of the seed's keys, with their remaining time (ms).
async fn pending_records(url: &str, prefix: &str) -> Vec<(String, i64)> {
    let client = redis::Client::open(url).expect("url");
    let mut raw = client
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let mut found = Vec::new();
    for k in 0..KEYS {
        let key = format!("{prefix}{}", storage_key("pay", None, &key_name(k)));
        let v: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .expect("GET");
        let Some(v) = v else { continue };
        let rec: Value = serde_json::from_str(&v).expect("a record");
        if rec["status"] == "PENDING" {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut raw)
                .await
                .expect("PTTL");
            found.push((key, ttl));
        }
    }
    found
}

/// Runs one seed; returns the redis server, the prefix and the ledger.
async fn one_seed(seed: u64, redis: RedisServer) -> (RedisServer, String, Shared) {
    let url = redis.url();
    let prefix = prefix();
    let ledger: Shared = Arc::new(Mutex::new(Ledger::new(seed)));
    let mut rng = Rng::new(seed);
    let tool_rng = Arc::new(Mutex::new(Rng::new(seed ^ 0x5eed)));
    let mut replicas = Vec::new();
    let mut conns = Vec::new();
    for r in 0..REPLICAS {
        let config = IdempotencyConfig {
            // One replica answers a running duplicate at once, the others wait for it.
            on_pending: if r == 0 {
                OnPending::FailFast
            } else {
                OnPending::Wait
            },
            on_store_error: OnStoreError::FailClosed,
            lease: LEASE,
            wait_timeout: LEASE + Duration::from_secs(2),
            poll_interval: Duration::from_millis(25),
            max_poll_interval: Duration::from_millis(200),
            ..IdempotencyConfig::default()
        };
        let conn = connect(&url, &prefix, OP_TIMEOUT).await;
        conns.push(conn.clone());
        let store = Arc::new(RedisIdempotencyStore::new(conn));
        replicas.push(stack(config, store, tool(r, &ledger, &tool_rng)).0);
    }
    let faults = plan(&mut rng);
    lock(&ledger).log(format!("seed {seed}: faults {faults:?}"));
    let injector = inject(redis, faults, Arc::clone(&ledger));

    let mut callers = tokio::task::JoinSet::new();
    for k in 0..KEYS {
        for d in 0..DUPLICATES {
            let r = rng.below(REPLICAS as u64) as usize;
            let start = rng.millis(WINDOW_MS);
            let drop_after = (rng.below(4) == 0).then(|| rng.millis(600));
            let svc = replicas[r].clone();
            let ledger = Arc::clone(&ledger);
            callers.spawn(async move {
                tokio::time::sleep(start).await;
                let who = format!("c{k}.{d}@r{r}");
                let sent = StdInstant::now();
                lock(&ledger).log(format!("{who} k{k} -> sent (drop after {drop_after:?})"));
                let a = send(svc, k, drop_after).await;
                check(&mut lock(&ledger), &who, k, sent, &a, false);
            });
        }
    }
    while let Some(joined) = callers.join_next().await {
        if let Err(e) = joined {
            lock(&ledger).violation(format!("a caller task failed: {e}"));
        }
    }
    let redis = injector.join().expect("the fault injector");
    // The background writes of dropped callers finish with Redis healthy.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Every replica's connection is back before the final phase.
    for conn in &conns {
        common::eventually(Duration::from_secs(10), "reconnection", || async {
            conn.health().await.ok()
        })
        .await;
    }
    // The final phase: every replica sends every key once more, one after another.
    lock(&ledger).log("final phase".into());
    for k in 0..KEYS {
        let mut first: Option<String> = None;
        for (r, svc) in replicas.iter().enumerate() {
            let who = format!("final@r{r}");
            let sent = StdInstant::now();
            let a = send(svc.clone(), k, None).await;
            let mut l = lock(&ledger);
            check(&mut l, &who, k, sent, &a, true);
            let log = l.keys[k].clone();
            // 4: a key whose effect happened is never free again: its answer is fixed.
            if log.effects > 0 {
                let this = match &a {
                    Answer::Ok(resp) => format!("ok {}", resp.output),
                    other => describe(other),
                };
                match &first {
                    None => first = Some(this),
                    Some(f) if *f != this => {
                        l.violation(format!("{who} k{k}: got {this}, an earlier final got {f}"))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    // 6: a PENDING record expires within one lease.
    for (key, ttl) in pending_records(&url, &prefix).await {
        let mut l = lock(&ledger);
        l.log(format!("PENDING {key} pttl {ttl}ms"));
        if ttl < 0 || ttl > LEASE.as_millis() as i64 {
            l.violation(format!("PENDING {key} expires in {ttl}ms, past its lease"));
        }
    }
    (redis, prefix, ledger)
}

fn report(l: &Ledger) -> String {
    let keys: Vec<String> = l
        .keys
        .iter()
        .enumerate()
        .map(|(k, log)| format!("k{k}: {log:?}"))
        .collect();
    format!(
        "seed {}: {} violation(s):\n  {}\nkeys:\n  {}\ntrace:\n  {}",
        l.seed,
        l.violations.len(),
        l.violations.join("\n  "),
        keys.join("\n  "),
        l.trace.join("\n  ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_across_replicas_under_random_faults_run_each_mutation_at_most_once() {
    let Some(mut redis) = private_persistent_redis(
        "duplicates_across_replicas_under_random_faults_run_each_mutation_at_most_once",
    ) else {
        return;
    };
    let seeds: Vec<u64> = match std::env::var("TOOLSHIELD_SEED") {
        Ok(s) => vec![s.parse().expect("TOOLSHIELD_SEED is a number")],
        Err(_) => (0..SEEDS).collect(),
    };
    let url = redis.url();
    let mut failures = Vec::new();
    let mut leftover: Vec<(String, Shared)> = Vec::new();
    let mut kinds = BTreeSet::new();
    for seed in seeds {
        let (server, prefix, ledger) = one_seed(seed, redis).await;
        redis = server;
        {
            let l = lock(&ledger);
            for line in &l.trace {
                if let Some(rest) = line.split("<- ").nth(1) {
                    kinds.insert(rest.split_whitespace().next().unwrap_or("").to_owned());
                }
            }
            if !l.violations.is_empty() {
                failures.push(report(&l));
            }
        }
        leftover.push((prefix, ledger));
    }
    // 6: once a lease has passed, no PENDING record is left anywhere.
    let mut any_pending = HashMap::new();
    for (prefix, ledger) in &leftover {
        if lock(ledger).trace.iter().any(|t| t.contains(" PENDING ")) {
            any_pending.insert(prefix.clone(), Arc::clone(ledger));
        }
    }
    if !any_pending.is_empty() {
        tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
        for (prefix, ledger) in any_pending {
            let left = pending_records(&url, &prefix).await;
            if !left.is_empty() {
                let mut l = lock(&ledger);
                l.violation(format!("PENDING records outlived their lease: {left:?}"));
                failures.push(report(&l));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The plan reached the answers it is meant to check.
    for kind in ["ok", "OUTCOME_UNKNOWN", "STORE_UNAVAILABLE", "dropped"] {
        assert!(kinds.contains(kind), "no caller saw {kind}: {kinds:?}");
    }
}
