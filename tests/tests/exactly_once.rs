//! The randomized exactly-once checker.
//!
//! Many tasks call one mutating tool through three stacks that share one idempotency
//! store (one of them marking its attempts, behind a retry and a queue), with duplicates (fresh requests with the same key and clones of one request),
//! callers that give up (cancellation at any await), tools that are slow past their lease,
//! fail, time out after their effect, or hang, and store faults injected by a seeded
//! [`FaultPlan`] (failures, delays, writes applied before their reply was lost, writes
//! that land late). On Redis, the server is also paused (`SIGSTOP`/`SIGCONT`) and killed
//! and restarted during the run.
//!
//! Per idempotency key it asserts:
//! 1. never two executions of the tool at once;
//! 2. at most one effect, unless a caller was told `OUTCOME_UNKNOWN` or that the result is
//!    unrecorded for that key;
//! 3. a recorded (COMPLETED) result is never replaced: every replay of a key carries the
//!    same output, the output of an effect that happened;
//! 4. every caller gets a result the tool produced, or a typed error of an expected kind.
//!
//! In CI a fixed set of seeds runs (in memory on a paused clock, and on Redis in real
//! time). A long run:
//!
//! ```sh
//! TOOLSHIELD_CHECKER_SEEDS=2000 cargo test -p toolshield-tests --test exactly_once -- --nocapture
//! ```
//!
//! (`TOOLSHIELD_CHECKER_FIRST_SEED` picks the first seed; `TOOLSHIELD_CHECKER_REDIS_SEEDS`
//! the number of Redis runs, `TOOLSHIELD_CHECKER_CLUSTER_SEEDS` the number of runs on a
//! local Redis Cluster.) The totals are printed at the end of each test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::sleep;
use toolshield::provenance::AttemptProvenanceLayer;
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::testing::FaultyStore;
use toolshield_idempotency::{
    IdempotencyConfig, IdempotencyHandle, IdempotencyLayer, IdempotencyStore,
    InMemoryIdempotencyStore, OnPending,
};
use toolshield_retry::RetryLayer;
use toolshield_timeout::TimeoutLayer;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

// ----- what happened, per key -----

#[derive(Debug, Default)]
struct KeyLog {
    running: usize,
    max_running: usize,
    /// Outputs of the effects that took place.
    effects: Vec<Value>,
    told_unknown: bool,
    /// Callers that gave up (dropped their call): an effect of theirs is known to nobody,
    /// and the layer records it as OUTCOME_UNKNOWN unless the store fails for the rest of
    /// the lease.
    gave_up: usize,
    /// Outputs handed to callers as fresh (not replayed) successes, recorded or not.
    fresh: Vec<Value>,
    told_unrecorded: bool,
    /// Outputs handed to callers as fresh (not replayed) successes that were recorded.
    recorded_fresh: Vec<Value>,
    replays: Vec<Value>,
    /// What each caller got, for the report of a violation.
    outcomes: Vec<String>,
}

#[derive(Debug, Default)]
struct Totals {
    calls: u64,
    duplicates: u64,
    cancelled: u64,
    outcome_unknown: u64,
    unrecorded: u64,
    effects: u64,
    takeovers: u64,
    faults: u64,
    violations: Vec<String>,
}

#[derive(Default)]
struct Ledger {
    keys: Mutex<HashMap<String, KeyLog>>,
    next_effect: AtomicU64,
}

impl Ledger {
    fn with<R>(&self, key: &str, f: impl FnOnce(&mut KeyLog) -> R) -> R {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        f(keys.entry(key.to_owned()).or_default())
    }
}

/// Ends an execution in the ledger when the tool's future ends or is dropped.
struct Running {
    ledger: Arc<Ledger>,
    key: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.ledger.with(&self.key, |k| k.running -= 1);
    }
}

/// What one execution of the tool does, drawn from the run's random stream.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    /// Takes this long, then takes effect and answers.
    Succeed(Duration),
    /// Takes this long, then fails retriably without effect.
    FailRetriable(Duration),
    /// Takes this long, then rejects the call (non-retriable) without effect.
    Reject(Duration),
    /// Takes effect, then reports a timeout (its outcome is unknown to the caller).
    EffectThenTimeout(Duration),
    /// Never answers.
    Hang,
}

struct Scenario {
    lease: Duration,
    /// Tool durations are drawn up to this; a few run past the lease.
    unit: Duration,
}

fn draw(rng: &mut fastrand::Rng, s: &Scenario) -> Behaviour {
    let quick = |rng: &mut fastrand::Rng| s.unit.mul_f64(rng.f64());
    match rng.u32(0..100) {
        0..=54 => Behaviour::Succeed(quick(rng)),
        55..=64 => Behaviour::Succeed(s.lease.mul_f64(1.0 + rng.f64())),
        65..=76 => Behaviour::FailRetriable(quick(rng)),
        77..=82 => Behaviour::Reject(quick(rng)),
        83..=93 => Behaviour::EffectThenTimeout(quick(rng)),
        _ => Behaviour::Hang,
    }
}

fn tool(ledger: &Arc<Ledger>, rng: &Arc<Mutex<fastrand::Rng>>, scenario: Arc<Scenario>) -> Svc {
    let ledger = Arc::clone(ledger);
    let rng = Arc::clone(rng);
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let ledger = Arc::clone(&ledger);
        let behaviour = draw(
            &mut rng.lock().unwrap_or_else(|e| e.into_inner()),
            &scenario,
        );
        async move {
            let key = req.payload()["order"].as_str().unwrap_or("?").to_owned();
            ledger.with(&key, |k| {
                k.running += 1;
                k.max_running = k.max_running.max(k.running);
            });
            let running = Running {
                ledger: Arc::clone(&ledger),
                key: key.clone(),
            };
            let effect = |running: &Running| {
                let id = running.ledger.next_effect.fetch_add(1, Ordering::SeqCst);
                let out = json!({"order": running.key, "effect": id});
                running
                    .ledger
                    .with(&running.key, |k| k.effects.push(out.clone()));
                out
            };
            let result = match behaviour {
                Behaviour::Succeed(d) => {
                    sleep(d).await;
                    Ok(ToolResponse::new(effect(&running)))
                }
                Behaviour::FailRetriable(d) => {
                    sleep(d).await;
                    Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
                }
                Behaviour::Reject(d) => {
                    sleep(d).await;
                    Err(ToolError::new(ErrorKind::ExecutionFailed, "card declined"))
                }
                Behaviour::EffectThenTimeout(d) => {
                    effect(&running);
                    sleep(d).await;
                    Err(ToolError::new(
                        ErrorKind::Timeout,
                        "no answer after the charge",
                    ))
                }
                Behaviour::Hang => std::future::pending().await,
            };
            result
        }
    }))
}

// ----- one run -----

/// Holds half the calls for a random wait of up to `max` (a bulkhead's queue, a rate
/// limiter's turn) before handing them on.
fn queued<S>(inner: S, rng: &Arc<Mutex<fastrand::Rng>>, max: Duration) -> Svc
where
    S: tower::Service<ToolRequest, Response = ToolResponse, Error = ToolError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let rng = Arc::clone(rng);
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let inner = inner.clone();
        let wait = {
            let mut g = rng.lock().unwrap_or_else(|e| e.into_inner());
            if g.bool() {
                Duration::ZERO
            } else {
                max.mul_f64(g.f64())
            }
        };
        async move {
            sleep(wait).await;
            inner.oneshot(req).await
        }
    }))
}

struct Run {
    seed: u64,
    keys: usize,
    calls_per_key: std::ops::RangeInclusive<usize>,
    spread: Duration,
    scenario: Arc<Scenario>,
    config: IdempotencyConfig,
    attempt_timeout: Duration,
    caller_patience: Duration,
}

/// Runs one seed over `stores` (one per stack; they share their records) and checks the
/// invariants; returns its totals.
async fn run(r: Run, stores: Vec<Arc<dyn IdempotencyStore>>, plan: FaultPlan) -> Totals {
    let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(r.seed)));
    let ledger = Arc::new(Ledger::default());
    let mut stacks: Vec<(Svc, IdempotencyHandle)> = Vec::new();
    for (i, store) in stores.into_iter().enumerate() {
        let cfg = IdempotencyConfig {
            on_pending: if i == 2 {
                OnPending::FailFast
            } else {
                OnPending::Wait
            },
            ..r.config.clone()
        };
        let layer = IdempotencyLayer::with_store(cfg, store).expect("valid config");
        let tool = tool(&ledger, &rng, Arc::clone(&r.scenario));
        // The second stack marks its attempts, as the shield's do: a queue in front (a
        // random wait, as in a bulkhead), the mark right above the tool, and the layer
        // told so, which frees the key of a call dropped in the queue.
        let (layer, inner) = if i == 1 {
            let marked = AttemptProvenanceLayer::new().layer(tool);
            let timed = TimeoutLayer::new(r.attempt_timeout).layer(marked);
            let wait = r.attempt_timeout / 2;
            // And a retry above the queue, as in the shield: a refused attempt (nothing
            // ran) undoes its mark, so a call dropped while it waits to retry frees its
            // key too.
            let retried = RetryLayer::new(3).layer(queued(timed, &rng, wait));
            (layer.with_attempt_marks(), BoxCloneService::new(retried))
        } else {
            let timed = TimeoutLayer::new(r.attempt_timeout).layer(tool);
            (layer, BoxCloneService::new(timed))
        };
        let handle = layer.handle();
        stacks.push((BoxCloneService::new(layer.layer(inner)), handle));
    }

    let mut totals = Totals::default();
    let mut tasks = Vec::new();
    {
        let mut g = rng.lock().unwrap_or_else(|e| e.into_inner());
        for k in 0..r.keys {
            let key = format!("order-{}-{k}", r.seed);
            let n = g.usize(r.calls_per_key.clone());
            totals.calls += n as u64;
            totals.duplicates += n.saturating_sub(1) as u64;
            let original = ToolRequest::new("pay", json!({"order": key}))
                .kind(CallKind::Mutating)
                .idempotency_key(key.clone());
            for _ in 0..n {
                // Half the duplicates are clones of one request (one execution id).
                let req = if g.bool() {
                    original.clone()
                } else {
                    ToolRequest::new("pay", json!({"order": key}))
                        .kind(CallKind::Mutating)
                        .idempotency_key(key.clone())
                };
                let svc = stacks[g.usize(0..stacks.len())].0.clone();
                let start = r.spread.mul_f64(g.f64());
                let patience = if g.u32(0..100) < 20 {
                    r.caller_patience.mul_f64(g.f64())
                } else {
                    r.caller_patience * 4
                };
                let key = key.clone();
                tasks.push(tokio::spawn(async move {
                    sleep(start).await;
                    let out = tokio::time::timeout(patience, svc.oneshot(req)).await;
                    (key, out)
                }));
            }
        }
    }

    let mut results = Vec::new();
    for t in tasks {
        match t.await {
            Ok(r) => results.push(r),
            Err(e) => totals
                .violations
                .push(format!("a caller's task panicked: {e}")),
        }
    }
    // Let background clean-ups (releases, late writes) finish.
    sleep(r.scenario.lease * 3).await;

    for (key, out) in results {
        let Ok(result) = out else {
            totals.cancelled += 1;
            ledger.with(&key, |k| {
                k.gave_up += 1;
                k.outcomes.push("gave up".into());
            });
            continue;
        };
        let what = match &result {
            Ok(r) => format!(
                "ok {} replayed={} unrecorded={}",
                r.output, r.provenance.replayed, r.provenance.unrecorded
            ),
            Err(e) => format!("{}: {}", e.code(), e.message()),
        };
        ledger.with(&key, |k| k.outcomes.push(what));
        match result {
            Ok(resp) => {
                let output = resp.output.clone();
                ledger.with(&key, |k| {
                    if resp.provenance.unrecorded {
                        k.told_unrecorded = true;
                    }
                    if resp.provenance.replayed {
                        k.replays.push(output);
                    } else {
                        if !k.fresh.contains(&output) {
                            k.fresh.push(output.clone());
                        }
                        if !resp.provenance.unrecorded {
                            k.recorded_fresh.push(output);
                        }
                    }
                });
                if resp.provenance.unrecorded {
                    totals.unrecorded += 1;
                }
            }
            Err(e) => match e.kind() {
                ErrorKind::OutcomeUnknown => {
                    totals.outcome_unknown += 1;
                    ledger.with(&key, |k| k.told_unknown = true);
                }
                ErrorKind::InProgress
                | ErrorKind::StoreUnavailable
                | ErrorKind::UpstreamUnavailable
                | ErrorKind::ExecutionFailed => {}
                other => totals
                    .violations
                    .push(format!("{key}: unexpected error {other:?}: {e}")),
            },
        }
    }

    let keys = ledger.keys.lock().unwrap_or_else(|e| e.into_inner());
    for (key, k) in keys.iter() {
        totals.effects += k.effects.len() as u64;
        if k.max_running > 1 {
            totals
                .violations
                .push(format!("{key}: {} executions ran at once", k.max_running));
        }
        // Without an OUTCOME_UNKNOWN (or unrecorded) told for the key, at most one effect
        // reached a caller, and every other effect belongs to a caller that gave up.
        let untold = k.effects.len().saturating_sub(k.fresh.len());
        if !k.told_unknown && !k.told_unrecorded && (k.fresh.len() > 1 || untold > k.gave_up) {
            totals.violations.push(format!(
                "{key}: {} effects and no caller was told OUTCOME_UNKNOWN; callers got {:?}",
                k.effects.len(),
                k.outcomes
            ));
        }
        for out in k.recorded_fresh.iter().chain(k.replays.iter()) {
            if !k.effects.contains(out) {
                totals.violations.push(format!(
                    "{key}: a caller got {out}, which no effect produced"
                ));
            }
        }
        if let Some(first) = k.recorded_fresh.first().or(k.replays.first()) {
            if k.recorded_fresh
                .iter()
                .chain(k.replays.iter())
                .any(|o| o != first)
            {
                totals.violations.push(format!(
                    "{key}: a recorded result was replaced: fresh {:?}, replays {:?}",
                    k.recorded_fresh, k.replays
                ));
            }
        }
    }
    totals.takeovers = stacks.iter().map(|(_, h)| h.counts().takeovers).sum();
    totals.faults = plan.injected();
    totals
}

fn seeds(var: &str, default: u64) -> std::ops::Range<u64> {
    let n = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    let first = std::env::var("TOOLSHIELD_CHECKER_FIRST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    first..first + n
}

fn faults(plan: &FaultPlan, seed: u64, rate: f64, late: Duration) {
    plan.random(
        seed,
        rate,
        &[],
        &[
            Fault::Fail,
            Fault::ApplyThenFail,
            Fault::ApplyLater(late),
            Fault::Delay(late / 2),
            Fault::Fail,
        ],
    );
}

fn add(all: &mut Totals, t: Totals) {
    all.calls += t.calls;
    all.duplicates += t.duplicates;
    all.cancelled += t.cancelled;
    all.outcome_unknown += t.outcome_unknown;
    all.unrecorded += t.unrecorded;
    all.effects += t.effects;
    all.takeovers += t.takeovers;
    all.faults += t.faults;
    all.violations.extend(t.violations);
}

fn report(name: &str, runs: u64, all: &Totals) {
    println!(
        "{name}: {runs} runs, {} calls ({} duplicates), {} effects, {} faults injected, \
         {} callers gave up, {} OUTCOME_UNKNOWN, {} unrecorded, {} takeovers, {} violations",
        all.calls,
        all.duplicates,
        all.effects,
        all.faults,
        all.cancelled,
        all.outcome_unknown,
        all.unrecorded,
        all.takeovers,
        all.violations.len()
    );
    assert!(
        all.violations.is_empty(),
        "exactly-once violated:\n{}",
        all.violations.join("\n")
    );
}

// ----- in memory, on the paused clock -----

#[test]
fn exactly_once_holds_in_memory_under_faults_clones_and_cancellations() {
    let mut all = Totals::default();
    let range = seeds("TOOLSHIELD_CHECKER_SEEDS", 24);
    let runs = range.end - range.start;
    for seed in range {
        // A fresh paused runtime per seed: the run is a function of its seed.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        let totals = rt.block_on(async move {
            let plan = FaultPlan::new();
            faults(&plan, seed, 0.08, Duration::from_secs(2));
            let store: Arc<dyn IdempotencyStore> = Arc::new(FaultyStore::new(
                Arc::new(InMemoryIdempotencyStore::new()),
                plan.clone(),
            ));
            let lease = Duration::from_secs(30);
            let run_cfg = Run {
                seed,
                keys: 25,
                calls_per_key: 1..=6,
                spread: Duration::from_secs(90),
                scenario: Arc::new(Scenario {
                    lease,
                    unit: Duration::from_secs(10),
                }),
                config: IdempotencyConfig {
                    lease,
                    wait_timeout: Duration::from_secs(20),
                    ..IdempotencyConfig::default()
                },
                attempt_timeout: Duration::from_secs(70),
                caller_patience: Duration::from_secs(60),
            };
            // Outages of the store, some longer than the lease.
            let chaos_plan = plan.clone();
            let chaos = tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(seed ^ 0x0DD);
                loop {
                    sleep(Duration::from_secs(rng.u64(10..60))).await;
                    chaos_plan.outage(true);
                    sleep(Duration::from_secs(rng.u64(3..40))).await;
                    chaos_plan.outage(false);
                }
            });
            let totals = run(run_cfg, vec![store.clone(), store.clone(), store], plan).await;
            chaos.abort();
            totals
        });
        if !totals.violations.is_empty() {
            eprintln!("seed {seed}: {:#?}", totals.violations);
        }
        add(&mut all, totals);
    }
    report("in memory", runs, &all);
    assert!(
        all.faults > 0 && all.takeovers > 0 && all.outcome_unknown > 0 && all.cancelled > 0,
        "the run exercised faults, takeovers, unknown outcomes and cancellations: {all:?}"
    );
}

// ----- on Redis, in real time, with pauses and a restart -----

#[test]
fn exactly_once_holds_on_redis_under_pauses_restarts_and_faults() {
    use toolshield_redis::testing::private_persistent_redis;
    use toolshield_redis::{RedisConfig, RedisConnection, RedisIdempotencyStore};

    let Some(mut redis) =
        private_persistent_redis("exactly_once_holds_on_redis_under_pauses_restarts_and_faults")
    else {
        return;
    };
    let mut all = Totals::default();
    let range = seeds("TOOLSHIELD_CHECKER_REDIS_SEEDS", 3);
    let runs = range.end - range.start;
    if runs == 0 {
        return;
    }
    for seed in range {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let url = redis.url();
        let (checker, chaos_rng) = rt.block_on(async {
            let plan = FaultPlan::new();
            faults(&plan, seed, 0.03, Duration::from_millis(150));
            let prefix = toolshield_redis::testing::unique_prefix();
            // Three connections: three processes sharing one Redis.
            let mut stores: Vec<Arc<dyn IdempotencyStore>> = Vec::new();
            for _ in 0..3 {
                let config = RedisConfig::from_url(&url)
                    .with_key_prefix(&prefix)
                    .with_op_timeout(Duration::from_millis(150));
                let conn = RedisConnection::connect(config).await.expect("redis");
                stores.push(Arc::new(FaultyStore::new(
                    Arc::new(RedisIdempotencyStore::new(conn)),
                    plan.clone(),
                )));
            }
            let lease = Duration::from_millis(900);
            let run_cfg = Run {
                seed,
                keys: 30,
                calls_per_key: 1..=5,
                spread: Duration::from_secs(3),
                scenario: Arc::new(Scenario {
                    lease,
                    unit: Duration::from_millis(300),
                }),
                config: IdempotencyConfig {
                    lease,
                    wait_timeout: Duration::from_secs(2),
                    poll_interval: Duration::from_millis(20),
                    max_poll_interval: Duration::from_millis(100),
                    ..IdempotencyConfig::default()
                },
                attempt_timeout: Duration::from_secs(3),
                caller_patience: Duration::from_secs(3),
            };
            let checker = tokio::spawn(run(run_cfg, stores, plan));
            (checker, fastrand::Rng::with_seed(seed ^ 0xC4A05))
        });
        // Chaos while the run goes on: pauses, and one kill + restart (the server keeps
        // every acknowledged write: appendfsync always).
        let server = &mut redis;
        rt.block_on(async move {
            let mut chaos = chaos_rng;
            let started = tokio::time::Instant::now();
            let mut restarted = false;
            while started.elapsed() < Duration::from_secs(4) {
                sleep(Duration::from_millis(chaos.u64(200..600))).await;
                if !restarted && started.elapsed() > Duration::from_secs(2) {
                    tokio::task::block_in_place(|| server.restart()).expect("redis restarts");
                    restarted = true;
                } else {
                    server.pause();
                    sleep(Duration::from_millis(chaos.u64(100..700))).await;
                    server.resume();
                }
            }
        });
        let totals = rt.block_on(checker).expect("the checker task");
        if !totals.violations.is_empty() {
            eprintln!("redis seed {seed}: {:#?}", totals.violations);
        }
        add(&mut all, totals);
    }
    report("redis", runs, &all);
    assert!(all.faults > 0 && all.cancelled > 0, "{all:?}");
}

// ----- on a Redis Cluster, in real time, with pauses and a master killed -----

#[test]
fn exactly_once_holds_on_a_redis_cluster_under_pauses_a_dead_master_and_faults() {
    use toolshield_redis::testing::{private_cluster, ClusterOptions};
    use toolshield_redis::{RedisConfig, RedisConnection, RedisIdempotencyStore};

    let range = seeds("TOOLSHIELD_CHECKER_CLUSTER_SEEDS", 2);
    let runs = range.end - range.start;
    if runs == 0 {
        return;
    }
    let mut all = Totals::default();
    for seed in range {
        // A fresh cluster per seed: the last seconds of each run have a dead master.
        let test = "exactly_once_holds_on_a_redis_cluster_under_pauses_a_dead_master_and_faults";
        let Some(mut cluster) = private_cluster(test, ClusterOptions::default()) else {
            return;
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let seeds_urls = cluster.seeds();
        let prefix = toolshield_redis::testing::unique_prefix();
        // Every key is of the tool `pay`: one hash tag, one slot, one master.
        let owner = cluster
            .master_of(&format!("{prefix}idemp:{{pay}}"))
            .expect("the master of pay's slot");
        let (checker, chaos_rng) = rt.block_on(async {
            let plan = FaultPlan::new();
            faults(&plan, seed, 0.03, Duration::from_millis(150));
            // Three connections: three processes sharing one cluster.
            let mut stores: Vec<Arc<dyn IdempotencyStore>> = Vec::new();
            for _ in 0..3 {
                let config = RedisConfig::cluster(seeds_urls.clone())
                    .with_key_prefix(&prefix)
                    .with_op_timeout(Duration::from_millis(150));
                let conn = RedisConnection::connect(config)
                    .await
                    .expect("redis cluster");
                stores.push(Arc::new(FaultyStore::new(
                    Arc::new(RedisIdempotencyStore::new(conn)),
                    plan.clone(),
                )));
            }
            let lease = Duration::from_millis(900);
            let run_cfg = Run {
                seed,
                keys: 30,
                calls_per_key: 1..=5,
                spread: Duration::from_secs(3),
                scenario: Arc::new(Scenario {
                    lease,
                    unit: Duration::from_millis(300),
                }),
                config: IdempotencyConfig {
                    lease,
                    wait_timeout: Duration::from_secs(2),
                    poll_interval: Duration::from_millis(20),
                    max_poll_interval: Duration::from_millis(100),
                    ..IdempotencyConfig::default()
                },
                attempt_timeout: Duration::from_secs(3),
                caller_patience: Duration::from_secs(3),
            };
            let checker = tokio::spawn(run(run_cfg, stores, plan));
            (checker, fastrand::Rng::with_seed(seed ^ 0xC1A5))
        });
        // Chaos: pauses of the master that serves the keys, another master killed, and in
        // the last second the serving master killed too (no replica: its records are gone
        // and every later call fails closed; nothing may run twice).
        let other = cluster
            .ports()
            .into_iter()
            .find(|p| *p != owner)
            .expect("another master");
        let cluster_ref = &mut cluster;
        rt.block_on(async move {
            let mut chaos = chaos_rng;
            let started = tokio::time::Instant::now();
            let mut other_killed = false;
            while started.elapsed() < Duration::from_secs(3) {
                sleep(Duration::from_millis(chaos.u64(200..600))).await;
                if !other_killed && started.elapsed() > Duration::from_secs(1) {
                    cluster_ref.kill_node(other);
                    other_killed = true;
                } else {
                    cluster_ref.pause_node(owner);
                    sleep(Duration::from_millis(chaos.u64(100..500))).await;
                    cluster_ref.resume_node(owner);
                }
            }
            cluster_ref.kill_node(owner);
        });
        let totals = rt.block_on(checker).expect("the checker task");
        if !totals.violations.is_empty() {
            eprintln!("cluster seed {seed}: {:#?}", totals.violations);
        }
        add(&mut all, totals);
    }
    report("redis cluster", runs, &all);
    assert!(all.faults > 0 && all.cancelled > 0, "{all:?}");
}
