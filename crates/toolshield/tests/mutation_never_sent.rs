//! A mutation that never reached its tool ran nothing: dropped or cancelled while it
//! waited (in a bulkhead's queue, here), it frees its idempotency key, and a waiting
//! duplicate or a later call runs it, instead of every caller being told
//! `OUTCOME_UNKNOWN` for a day. One that did reach the tool (or a fallback tier, or an
//! injected fault standing for the tool) and was dropped stays `OUTCOME_UNKNOWN`: it may
//! have charged.
//!
//! So is a mutation whose attempts were all refused (`RATE_LIMITED`, nothing ran),
//! dropped or cancelled while it waits to be tried again.
//!
//! The last test is a randomized checker: callers of a few keys queue behind one slot,
//! give up or cancel at random, and the tool takes effect, hangs or refuses; per key,
//! the tool takes effect at most once, and a key is kept `OUTCOME_UNKNOWN` only if some
//! call of it reached the tool and was not refused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::sleep;
use toolshield::fallback::FallbackLayer;
use toolshield::prelude::*;
use toolshield::BoxTool;
use toolshield_core::CancellationToken;
use toolshield_test::Rng;
use tower::{service_fn, ServiceExt};

const CONFIG: &str = r#"
[tools.pay]
kind = "mutating"
timeout = { attempt = "5s" }
bulkhead = { max_concurrent = 1, max_queue = 64, queue_timeout = "60s" }
idempotency = { on_pending = "wait", wait_timeout = "60s" }

[tools.faulty]
kind = "mutating"
faults = { enabled = true, seed = 7, hang = { rate = 1.0 } }
"#;

fn shield() -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(CONFIG).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// What the tool saw, per order: how often it was entered, and its effects.
#[derive(Debug, Default)]
struct Seen {
    entered: BTreeMap<String, u32>,
    /// Entries that did not end in a refusal the caller received (the randomized
    /// checker's tool).
    uncertain: BTreeMap<String, u32>,
    effects: BTreeMap<String, Vec<Value>>,
}

type Shared = Arc<Mutex<Seen>>;

fn lock(seen: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

/// A payment tool: the order `hold` holds the tool for 4 s (taking effect at the end);
/// every other order takes effect at once.
fn pay(seen: &Shared) -> BoxTool {
    let seen = Arc::clone(seen);
    BoxTool::new(service_fn(move |req: ToolRequest| {
        let seen = Arc::clone(&seen);
        let order = req.payload()["order"].as_str().unwrap_or("").to_owned();
        *lock(&seen).entered.entry(order.clone()).or_default() += 1;
        async move {
            if order == "hold" {
                sleep(Duration::from_secs(4)).await;
            }
            let mut s = lock(&seen);
            let effects = s.effects.entry(order.clone()).or_default();
            let out = json!({ "order": order, "charge": effects.len() });
            effects.push(out.clone());
            Ok::<_, ToolError>(ToolResponse::new(out))
        }
    }))
}

fn order(tool: &str, order: &str) -> ToolRequest {
    ToolRequest::new(tool, json!({ "order": order })).idempotency_key(format!("key-{order}"))
}

/// Occupies the bulkhead's one slot for 4 s.
fn hold(svc: &BoxTool) -> tokio::task::JoinHandle<Result<ToolResponse, ToolError>> {
    tokio::spawn(svc.clone().oneshot(order("pay", "hold")))
}

#[tokio::test(start_paused = true)]
async fn a_mutation_dropped_while_queued_in_the_bulkhead_frees_its_key() {
    let shield = shield();
    let seen = Shared::default();
    let svc = BoxTool::new(shield.wrap("pay", pay(&seen)));
    let holder = hold(&svc);
    sleep(Duration::from_millis(10)).await;

    // Queued behind the holder; its caller gives up after a second.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone().oneshot(order("pay", "7")),
    )
    .await;
    assert!(gave_up.is_err(), "still queued: {gave_up:?}");
    assert!(holder.await.expect("holder task").is_ok());
    assert_eq!(lock(&seen).entered.get("7"), None, "never reached the tool");

    // The key is free: the call runs, once.
    let res = svc
        .clone()
        .oneshot(order("pay", "7"))
        .await
        .expect("the key was freed, not kept OUTCOME_UNKNOWN");
    assert!(!res.provenance.replayed);
    assert_eq!(lock(&seen).effects.get("7").map(Vec::len), Some(1));
    let again = svc.oneshot(order("pay", "7")).await.expect("a replay");
    assert!(again.provenance.replayed, "recorded once it ran");
    assert_eq!(lock(&seen).entered.get("7"), Some(&1));
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_waiting_on_a_caller_who_cancelled_in_the_queue_runs_the_call_itself() {
    let shield = shield();
    let seen = Shared::default();
    let svc = BoxTool::new(shield.wrap("pay", pay(&seen)));
    let holder = hold(&svc);
    sleep(Duration::from_millis(10)).await;

    let token = CancellationToken::new();
    let first = tokio::spawn(
        svc.clone()
            .oneshot(order("pay", "8").cancel_token(token.clone())),
    );
    sleep(Duration::from_millis(100)).await;
    // The same order again: it waits for the first caller's outcome.
    let duplicate = tokio::spawn(svc.clone().oneshot(order("pay", "8")));
    sleep(Duration::from_secs(1)).await;
    token.cancel();
    let e = first.await.expect("first task").expect_err("cancelled");
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e:?}");

    // One caller's cancellation is not the other's error: nothing ran, so the duplicate
    // runs the order once the slot frees.
    let res = duplicate
        .await
        .expect("duplicate task")
        .expect("the duplicate ran the order");
    assert!(!res.provenance.replayed, "nothing to replay: {res:?}");
    assert!(holder.await.expect("holder task").is_ok());
    assert_eq!(lock(&seen).entered.get("8"), Some(&1));
    assert_eq!(lock(&seen).effects.get("8").map(Vec::len), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_mutation_dropped_after_it_reached_the_tool_stays_outcome_unknown() {
    let shield = shield();
    let seen = Shared::default();
    let svc = BoxTool::new(shield.wrap("pay", pay(&seen)));
    // The holder itself is the call dropped while its tool runs.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone().oneshot(order("pay", "hold")),
    )
    .await;
    assert!(gave_up.is_err());
    sleep(Duration::from_millis(100)).await;
    let e = svc
        .clone()
        .oneshot(order("pay", "hold"))
        .await
        .expect_err("it may have charged");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
    assert_eq!(
        lock(&seen).entered.get("hold"),
        Some(&1),
        "never sent again"
    );
}

#[tokio::test(start_paused = true)]
async fn an_injected_hang_stands_for_the_tool_and_a_drop_there_stays_outcome_unknown() {
    let shield = shield();
    let seen = Shared::default();
    let svc = BoxTool::new(shield.wrap("faulty", pay(&seen)));
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone().oneshot(order("faulty", "9")),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the injected hang holds the call: {gave_up:?}"
    );
    sleep(Duration::from_millis(100)).await;
    let e = svc
        .oneshot(order("faulty", "9"))
        .await
        .expect_err("as after a real hang");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
}

#[tokio::test(start_paused = true)]
async fn a_mutation_dropped_in_a_bare_fallback_tier_stays_outcome_unknown() {
    let shield = shield();
    let seen = Shared::default();
    // The primary's breaker is held open: the primary never reaches its tool, and the
    // mutation is handed to a tier without a stack of its own.
    shield.breaker_for("pay").force_open("pay");
    let backup_seen = Shared::default();
    let chain = FallbackLayer::new().tier("backup", pay(&backup_seen));
    let svc = BoxTool::new(shield.wrap_with_fallback("pay", pay(&seen), Some(chain)));
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone().oneshot(order("pay", "hold")),
    )
    .await;
    assert!(gave_up.is_err(), "the tier holds the call: {gave_up:?}");
    assert_eq!(
        lock(&backup_seen).entered.get("hold"),
        Some(&1),
        "the tier ran"
    );
    sleep(Duration::from_millis(100)).await;
    let e = svc
        .oneshot(order("pay", "hold"))
        .await
        .expect_err("the tier may have charged");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
    assert_eq!(
        lock(&backup_seen).entered.get("hold"),
        Some(&1),
        "never sent again"
    );
    assert_eq!(lock(&seen).entered.get("hold"), None);
}

/// A payment tool whose first run is refused with `RATE_LIMITED` (retry after 2 s):
/// nothing ran, and the retry waits to send it again.
fn refused_once(seen: &Shared) -> BoxTool {
    let seen = Arc::clone(seen);
    BoxTool::new(service_fn(move |req: ToolRequest| {
        let seen = Arc::clone(&seen);
        let order = req.payload()["order"].as_str().unwrap_or("").to_owned();
        let n = {
            let mut s = lock(&seen);
            let n = s.entered.entry(order.clone()).or_default();
            *n += 1;
            *n
        };
        async move {
            if n == 1 {
                return Err(ToolError::new(ErrorKind::RateLimited, "429")
                    .with_retry_after(Duration::from_secs(2)));
            }
            let mut s = lock(&seen);
            let effects = s.effects.entry(order.clone()).or_default();
            let out = json!({ "order": order, "charge": effects.len() });
            effects.push(out.clone());
            Ok::<_, ToolError>(ToolResponse::new(out))
        }
    }))
}

#[tokio::test(start_paused = true)]
async fn a_mutation_dropped_while_it_waits_to_retry_a_refusal_frees_its_key() {
    let shield = shield();
    let seen = Shared::default();
    let svc = BoxTool::new(shield.wrap("pay", refused_once(&seen)));
    // The first attempt reached the tool and was refused; the caller gives up during the
    // retry's wait.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone().oneshot(order("pay", "r")),
    )
    .await;
    assert!(gave_up.is_err(), "still waiting to retry: {gave_up:?}");
    assert_eq!(lock(&seen).entered.get("r"), Some(&1));
    sleep(Duration::from_millis(100)).await;
    let res = svc
        .oneshot(order("pay", "r"))
        .await
        .expect("a refusal ran nothing: the key was freed");
    assert!(!res.provenance.replayed);
    assert_eq!(lock(&seen).effects.get("r").map(Vec::len), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_mutation_cancelled_while_it_waits_to_retry_a_refusal_frees_its_key() {
    let shield = shield();
    let seen = Shared::default();
    let svc = BoxTool::new(shield.wrap("pay", refused_once(&seen)));
    let token = CancellationToken::new();
    let call = tokio::spawn(
        svc.clone()
            .oneshot(order("pay", "s").cancel_token(token.clone())),
    );
    sleep(Duration::from_secs(1)).await;
    token.cancel();
    let e = call.await.expect("task").expect_err("cancelled");
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e:?}");
    sleep(Duration::from_millis(100)).await;
    let res = svc
        .oneshot(order("pay", "s"))
        .await
        .expect("a refusal ran nothing: the key was freed");
    assert!(!res.provenance.replayed);
    assert_eq!(lock(&seen).effects.get("s").map(Vec::len), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_inside_a_fallback_tier_does_not_undo_the_tier_s_start() {
    let shield = shield();
    let seen = Shared::default();
    shield.breaker_for("pay").force_open("pay");
    // A tier with a retry of its own, around a service refused once and then slow: the
    // tier started (it may have done anything), so its retry's refusal undoes only what
    // its own attempts marked, and a drop during its wait stays OUTCOME_UNKNOWN.
    let tier_seen = Shared::default();
    let ts = Arc::clone(&tier_seen);
    let tier = service_fn(move |req: ToolRequest| {
        let ts = Arc::clone(&ts);
        let order = req.payload()["order"].as_str().unwrap_or("").to_owned();
        let n = {
            let mut s = lock(&ts);
            let n = s.entered.entry(order).or_default();
            *n += 1;
            *n
        };
        async move {
            if n == 1 {
                return Err(ToolError::new(ErrorKind::RateLimited, "429")
                    .with_retry_after(Duration::from_secs(2)));
            }
            sleep(Duration::from_secs(3_600)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("late")))
        }
    });
    let tier = tower::Layer::layer(&toolshield::retry::RetryLayer::new(3), tier);
    let chain = FallbackLayer::new().tier("backup", tier);
    let svc = BoxTool::new(shield.wrap_with_fallback("pay", pay(&seen), Some(chain)));
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone().oneshot(order("pay", "t")),
    )
    .await;
    assert!(gave_up.is_err(), "the tier's retry is waiting: {gave_up:?}");
    assert_eq!(lock(&tier_seen).entered.get("t"), Some(&1));
    sleep(Duration::from_millis(100)).await;
    let e = svc
        .oneshot(order("pay", "t"))
        .await
        .expect_err("the tier may have done anything");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
}

/// How a call of the randomized checker's tool behaves.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    /// Takes effect after the delay (a call dropped before then took none, yet was sent).
    Succeed(Duration),
    /// Takes effect at once, then hangs past the attempt timeout.
    EffectThenHang,
    /// Refuses after the delay: nothing ran (retried).
    Refuse(Duration),
}

fn random_tool(seen: &Shared, rng: &Arc<Mutex<Rng>>, probing: &Arc<Mutex<bool>>) -> BoxTool {
    let seen = Arc::clone(seen);
    let rng = Arc::clone(rng);
    let probing = Arc::clone(probing);
    BoxTool::new(service_fn(move |req: ToolRequest| {
        let seen = Arc::clone(&seen);
        let order = req.payload()["order"].as_str().unwrap_or("").to_owned();
        *lock(&seen).entered.entry(order.clone()).or_default() += 1;
        let behaviour = if *probing.lock().unwrap_or_else(|e| e.into_inner()) {
            Behaviour::Succeed(Duration::ZERO)
        } else {
            let mut r = rng.lock().unwrap_or_else(|e| e.into_inner());
            match r.below(10) {
                0..=5 => Behaviour::Succeed(r.millis(1_500)),
                6..=7 => Behaviour::EffectThenHang,
                _ => Behaviour::Refuse(r.millis(500)),
            }
        };
        // Uncertain until it ends: a refusal dropped before it answered might have done
        // anything, as far as anyone outside the tool can tell.
        *lock(&seen).uncertain.entry(order.clone()).or_default() += 1;
        let token = req.call_token().clone();
        async move {
            let effect = |seen: &Shared| {
                let mut s = lock(seen);
                let effects = s.effects.entry(order.clone()).or_default();
                let out = json!({ "order": order, "charge": effects.len() });
                effects.push(out.clone());
                out
            };
            match behaviour {
                Behaviour::Succeed(d) => {
                    tokio::select! {
                        () = token.cancelled() => Err(ToolError::cancelled("stopped")),
                        () = sleep(d) => Ok(ToolResponse::new(effect(&seen))),
                    }
                }
                Behaviour::EffectThenHang => {
                    effect(&seen);
                    sleep(Duration::from_secs(3_600)).await;
                    Ok(ToolResponse::new(json!("too late")))
                }
                Behaviour::Refuse(d) => {
                    sleep(d).await;
                    if let Some(n) = lock(&seen).uncertain.get_mut(&order) {
                        *n -= 1;
                    }
                    Err(ToolError::new(ErrorKind::ConnectionFailed, "refused"))
                }
            }
        }
    }))
}

async fn one_seed(seed: u64) -> Vec<String> {
    let shield = shield();
    let rng = Arc::new(Mutex::new(Rng::new(seed)));
    let seen = Shared::default();
    let probing = Arc::new(Mutex::new(false));
    let svc = BoxTool::new(shield.wrap("pay", random_tool(&seen, &rng, &probing)));
    let orders = ["a", "b", "c", "d", "e", "f"];
    let mut tasks = Vec::new();
    {
        let mut r = rng.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..24 {
            let o = orders[r.below(orders.len() as u64) as usize];
            let start = r.millis(6_000);
            let token = CancellationToken::new();
            let req = order("pay", o).cancel_token(token.clone());
            // A third give up (their future dropped), a sixth cancel their token.
            let patience = match r.below(6) {
                0 | 1 => Some(r.millis(8_000)),
                _ => None,
            };
            let cancel_at = (r.below(6) == 0).then(|| r.millis(8_000));
            let svc = svc.clone();
            tasks.push(tokio::spawn(async move {
                sleep(start).await;
                if let Some(at) = cancel_at {
                    tokio::spawn(async move {
                        sleep(at).await;
                        token.cancel();
                    });
                }
                match patience {
                    Some(p) => tokio::time::timeout(p, svc.oneshot(req)).await.ok(),
                    None => Some(svc.oneshot(req).await),
                }
            }));
        }
    }
    let mut violations = Vec::new();
    for t in tasks {
        if let Some(Err(e)) = t.await.expect("caller task") {
            if !matches!(
                e.kind(),
                ErrorKind::OutcomeUnknown
                    | ErrorKind::Cancelled
                    | ErrorKind::ConnectionFailed
                    | ErrorKind::CircuitOpen
                    | ErrorKind::InProgress
            ) {
                violations.push(format!("unexpected error {e:?}"));
            }
        }
    }
    // Every claim, lease and background clean-up has ended.
    sleep(Duration::from_secs(600)).await;
    *probing.lock().unwrap_or_else(|e| e.into_inner()) = true;
    for o in orders {
        let (uncertain, effects_before) = {
            let s = lock(&seen);
            (
                s.uncertain.get(o).copied().unwrap_or(0),
                s.effects.get(o).cloned().unwrap_or_default(),
            )
        };
        let probe = svc.clone().oneshot(order("pay", o)).await;
        let effects_after = lock(&seen).effects.get(o).map_or(0, Vec::len);
        if effects_after > 1 {
            violations.push(format!("order {o} took effect {effects_after} times"));
        }
        match probe {
            Ok(res) if res.provenance.replayed => {
                if effects_before.first() != Some(&res.output) {
                    violations.push(format!(
                        "order {o}: replayed {} that no effect produced ({effects_before:?})",
                        res.output
                    ));
                }
            }
            Ok(_) => {
                if !effects_before.is_empty() {
                    violations.push(format!("order {o} ran again after taking effect"));
                }
            }
            Err(e) if e.kind() == ErrorKind::OutcomeUnknown => {
                if uncertain == 0 {
                    violations.push(format!(
                        "order {o} kept OUTCOME_UNKNOWN although every attempt of it that reached the tool was refused"
                    ));
                }
            }
            Err(e) => violations.push(format!("order {o}: the probe got {e:?}")),
        }
    }
    violations
        .into_iter()
        .map(|v| format!("seed {seed}: {v}"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn queued_mutations_given_up_at_random_take_effect_once_and_are_unknown_only_if_sent() {
    let seeds: u64 = toolshield_test::seeds_from_env("TOOLSHIELD_NEVER_SENT_SEEDS", 16);
    let mut violations = Vec::new();
    for seed in 1..=seeds {
        violations.extend(one_seed(seed).await);
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
