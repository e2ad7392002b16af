//! A randomized checker of one key's duplicates under store faults, on a paused clock.
//!
//! Per seed, callers send one key with its payload or with another one (a reuse), as
//! fresh requests or clones of one request, some cancelling their call token while they
//! wait or run, some with a deadline, some giving up (their future dropped), through two
//! services of one layer (one waiting on a running duplicate, one failing fast) over a
//! store that fails, answers late, applies writes whose reply is lost, or applies them
//! later. The tool watches its call token. Per key it checks:
//! 1. never two executions at once;
//! 2. at most one effect, unless a caller was told `OUTCOME_UNKNOWN` or that the result
//!    is unrecorded, or the effect belongs to a caller that gave up;
//! 3. effects for two payloads of one key only under the same exemptions;
//! 4. every replay is the output of an effect, and a recorded result is never replaced;
//! 5. every caller that did not give up gets an answer (no wait hangs), of an expected kind.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::sleep;
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{
    CallKind, CancellationToken, ErrorKind, ToolError, ToolRequest, ToolResponse,
};
use toolshield_idempotency::testing::FaultyStore;
use toolshield_idempotency::{
    IdempotencyConfig, IdempotencyLayer, InMemoryIdempotencyStore, OnPending,
};
use toolshield_test::Rng;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

#[derive(Debug, Default)]
struct Log {
    running: usize,
    max_running: usize,
    /// `(payload amount, output)` of each effect.
    effects: Vec<(u64, Value)>,
    told_unknown: bool,
    told_unrecorded: bool,
    gave_up: usize,
    fresh: Vec<Value>,
    recorded: Vec<Value>,
    replays: Vec<Value>,
    outcomes: Vec<String>,
    violations: Vec<String>,
}

struct Running(Arc<Mutex<Log>>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).running -= 1;
    }
}

#[derive(Debug, Clone, Copy)]
enum Behaviour {
    Succeed(Duration),
    FailRetriable(Duration),
    Reject(Duration),
    EffectThenTimeout(Duration),
}

fn tool(log: &Arc<Mutex<Log>>, rng: &Arc<Mutex<Rng>>, lease: Duration) -> Svc {
    let log = Arc::clone(log);
    let rng = Arc::clone(rng);
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let log = Arc::clone(&log);
        let behaviour = {
            let mut r = rng.lock().unwrap_or_else(|e| e.into_inner());
            let d = r.millis(800);
            match r.below(100) {
                0..=49 => Behaviour::Succeed(d),
                50..=59 => Behaviour::Succeed(lease.mul_f64(1.2)),
                60..=74 => Behaviour::FailRetriable(d),
                75..=84 => Behaviour::Reject(d),
                _ => Behaviour::EffectThenTimeout(d),
            }
        };
        async move {
            let amount = req.payload()["amount"].as_u64().unwrap_or(0);
            {
                let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                l.running += 1;
                l.max_running = l.max_running.max(l.running);
            }
            let running = Running(Arc::clone(&log));
            let effect = |running: &Running| {
                let mut l = running.0.lock().unwrap_or_else(|e| e.into_inner());
                let out = json!({ "amount": amount, "effect": l.effects.len() });
                l.effects.push((amount, out.clone()));
                out
            };
            let token = req.call_token().clone();
            let wait = |d: Duration| {
                let token = token.clone();
                async move {
                    tokio::select! {
                        () = token.cancelled() => Err(ToolError::cancelled("stopped")),
                        () = sleep(d) => Ok(()),
                    }
                }
            };
            match behaviour {
                Behaviour::Succeed(d) => {
                    wait(d).await?;
                    Ok(ToolResponse::new(effect(&running)))
                }
                Behaviour::FailRetriable(d) => {
                    wait(d).await?;
                    Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
                }
                Behaviour::Reject(d) => {
                    wait(d).await?;
                    Err(ToolError::new(ErrorKind::InvalidInput, "declined"))
                }
                Behaviour::EffectThenTimeout(d) => {
                    effect(&running);
                    sleep(d).await;
                    Err(ToolError::new(
                        ErrorKind::Timeout,
                        "no answer after the effect",
                    ))
                }
            }
        }
    }))
}

async fn one_seed(seed: u64) -> Vec<String> {
    let rng = Arc::new(Mutex::new(Rng::new(seed)));
    let log = Arc::new(Mutex::new(Log::default()));
    let lease = Duration::from_secs(3);
    let plan = FaultPlan::new();
    plan.random(
        seed,
        0.3,
        &[],
        &[
            Fault::Fail,
            Fault::ApplyThenFail,
            Fault::ApplyLater(Duration::from_millis(400)),
            Fault::Delay(Duration::from_millis(200)),
            Fault::Delay(Duration::from_millis(2_500)),
        ],
    );
    let store = Arc::new(FaultyStore::new(
        Arc::new(InMemoryIdempotencyStore::new()),
        plan.clone(),
    ));
    let cfg = IdempotencyConfig {
        lease,
        wait_timeout: Duration::from_secs(2),
        record_retry: Duration::from_millis(500),
        failed_ttl: Duration::from_secs(3_600),
        ..IdempotencyConfig::default()
    };
    let services: Vec<Svc> = [OnPending::Wait, OnPending::FailFast]
        .into_iter()
        .map(|on_pending| {
            let layer = IdempotencyLayer::with_store(
                IdempotencyConfig {
                    on_pending,
                    ..cfg.clone()
                },
                store.clone(),
            )
            .expect("valid config");
            BoxCloneService::new(layer.layer(tool(&log, &rng, lease)))
        })
        .collect();

    let original = ToolRequest::new("pay", json!({ "amount": 1 }))
        .kind(CallKind::Mutating)
        .idempotency_key("order-1");
    let mut tasks = Vec::new();
    {
        let mut r = rng.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..14 {
            let amount = if r.below(5) == 0 { 2 } else { 1 };
            let mut req = if amount == 1 && r.below(2) == 0 {
                original.clone()
            } else {
                ToolRequest::new("pay", json!({ "amount": amount }))
                    .kind(CallKind::Mutating)
                    .idempotency_key("order-1")
            };
            let token = CancellationToken::new();
            let cancel_at = (r.below(4) == 0).then(|| r.millis(4_000));
            if cancel_at.is_some() {
                req = ToolRequest::new("pay", json!({ "amount": amount }))
                    .kind(CallKind::Mutating)
                    .idempotency_key("order-1")
                    .cancel_token(token.clone());
            }
            let start = r.millis(4_000);
            if r.below(5) == 0 {
                let d = r.millis(3_000);
                req = req.deadline(tokio::time::Instant::now() + start + d);
            }
            // A caller that gives up drops its call; the others wait long enough for
            // any answer (a wait that does not end is a violation).
            let patience = if r.below(6) == 0 {
                r.millis(5_000)
            } else {
                Duration::from_secs(120)
            };
            let svc = services[r.below(2) as usize].clone();
            tasks.push(tokio::spawn(async move {
                sleep(start).await;
                if let Some(at) = cancel_at {
                    tokio::spawn(async move {
                        sleep(at).await;
                        token.cancel();
                    });
                }
                let out = tokio::time::timeout(patience, svc.oneshot(req)).await;
                (patience, out)
            }));
        }
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("caller task"));
    }
    sleep(lease * 3).await;

    let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
    for (patience, out) in results {
        let Ok(result) = out else {
            if patience == Duration::from_secs(120) {
                l.violations.push("a caller's call never ended".into());
            }
            l.gave_up += 1;
            l.outcomes.push("gave up".into());
            continue;
        };
        let what = match &result {
            Ok(r) => format!(
                "ok {} replayed={} unrecorded={}",
                r.output, r.provenance.replayed, r.provenance.unrecorded
            ),
            Err(e) => format!("{}: {}", e.code(), e.message()),
        };
        l.outcomes.push(what);
        match result {
            Ok(resp) => {
                if resp.provenance.unrecorded {
                    l.told_unrecorded = true;
                }
                if resp.provenance.replayed {
                    l.replays.push(resp.output);
                } else {
                    l.fresh.push(resp.output.clone());
                    if !resp.provenance.unrecorded {
                        l.recorded.push(resp.output);
                    }
                }
            }
            Err(e) => match e.kind() {
                ErrorKind::OutcomeUnknown => l.told_unknown = true,
                ErrorKind::InProgress
                | ErrorKind::StoreUnavailable
                | ErrorKind::UpstreamUnavailable
                | ErrorKind::InvalidInput
                | ErrorKind::IdempotencyKeyReused
                | ErrorKind::Cancelled => {}
                other => l
                    .violations
                    .push(format!("unexpected error {other:?}: {e}")),
            },
        }
    }
    if l.max_running > 1 {
        let n = l.max_running;
        l.violations.push(format!("{n} executions ran at once"));
    }
    let exempt = l.told_unknown || l.told_unrecorded;
    let untold = l.effects.len().saturating_sub(l.fresh.len());
    if !exempt && (l.fresh.len() > 1 || untold > l.gave_up) {
        let n = l.effects.len();
        l.violations.push(format!("{n} effects, nobody told"));
    }
    let payloads: std::collections::BTreeSet<u64> = l.effects.iter().map(|e| e.0).collect();
    if payloads.len() > 1 && !exempt && l.gave_up == 0 {
        l.violations
            .push("effects for two payloads of one key".into());
    }
    let outs: Vec<Value> = l.recorded.iter().chain(l.replays.iter()).cloned().collect();
    for out in &outs {
        if !l.effects.iter().any(|e| &e.1 == out) {
            l.violations
                .push(format!("{out} was produced by no effect"));
        }
    }
    if outs.windows(2).any(|w| w[0] != w[1]) {
        l.violations
            .push(format!("a recorded result was replaced: {outs:?}"));
    }
    let outcomes = l.outcomes.clone();
    let effects = l.effects.clone();
    l.violations
        .iter()
        .map(|v| format!("seed {seed}: {v}; effects {effects:?}; callers got {outcomes:?}"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn duplicates_of_one_key_under_store_faults_keep_exactly_once() {
    let seeds: u64 = toolshield_test::seeds_from_env("TOOLSHIELD_DUPLICATES_SEEDS", 40);
    let mut violations = Vec::new();
    for seed in 1..=seeds {
        violations.extend(one_seed(seed).await);
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
