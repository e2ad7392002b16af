//! The whole shield, built from one configuration, under randomized faults.
//!
//! Callers of three tools (a per-user cached read behind a bulkhead and hedging, a mutating
//! payment behind a rate limit, a plain read) run at once on a paused clock, with tools
//! that answer, fail with every kind of error, panic, run slow or hang, and callers that
//! cancel their token or drop their call at any moment. Per seed it asserts:
//! 1. no panic reaches a caller's task, and every call that is not dropped ends by its
//!    whole-call deadline (with the paused clock's slack);
//! 2. an answer is for the caller's own request: its tool and payload, and for a per-user
//!    or mutating tool its own caller;
//! 3. a payment under one key of one caller takes effect at most once, unless a caller of
//!    that key was told the outcome is unknown (`OUTCOME_UNKNOWN`) or unrecorded;
//! 4. once every call has ended, nothing is left held: the bulkhead admits as many calls
//!    as it allows, and a new payment key runs;
//! 5. `/metrics` stays valid exposition text.
//!
//! More seeds: `TOOLSHIELD_SHIELD_SEEDS=500 cargo test -p toolshield-tests --test
//! shield_under_faults -- --nocapture`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use toolshield::config::ShieldConfig;
use toolshield::shield::{BoxTool, Shield};
use toolshield_core::{
    idempotency_key_of, CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse,
};
use toolshield_test::Rng;
use tower::{service_fn, ServiceExt};

const CONFIG: &str = r#"
[defaults]
timeout = { attempt = "2s", soft = "500ms", total = "6s" }
retry = { max_attempts = 3, backoff = { strategy = "exponential", base = "50ms", factor = 2.0, cap = "400ms" } }
breaker = { consecutive_failures = 6, open_wait = "1s" }

[tools.read]
kind = "read_only"
cache = { ttl = "1s", stale_if_error = "2s", per_user = true }
bulkhead = { max_concurrent = 3, max_queue = 4, queue_timeout = "500ms" }
hedge = { enabled = true, delay = "300ms", max_hedges = 1 }

[tools.pay]
kind = "mutating"
rate_limit = { rate = 20, period = "1s", on_limit = "wait" }

[tools.plain]
kind = "read_only"
"#;

/// The whole-call deadline of `CONFIG`.
const TOTAL: Duration = Duration::from_secs(6);

const TOOLS: [&str; 3] = ["read", "pay", "plain"];
const CALLERS: [&str; 3] = ["alice", "bob", "carol"];

/// What one execution of a tool does.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    Answer(Duration),
    Fail(ErrorKind, Duration),
    Panic,
    Hang,
}

fn draw(rng: &mut Rng) -> Behaviour {
    let wait = rng.millis(2_500);
    match rng.below(100) {
        0..=54 => Behaviour::Answer(wait),
        55..=84 => {
            const KINDS: [ErrorKind; 7] = [
                ErrorKind::UpstreamUnavailable,
                ErrorKind::ConnectionFailed,
                ErrorKind::RateLimited,
                ErrorKind::Timeout,
                ErrorKind::InvalidInput,
                ErrorKind::ExecutionFailed,
                ErrorKind::Unauthorized,
            ];
            Behaviour::Fail(KINDS[rng.below(KINDS.len() as u64) as usize], wait)
        }
        85..=91 => Behaviour::Panic,
        _ => Behaviour::Hang,
    }
}

/// How an execution of a payment ended, as far as its effect goes.
#[derive(Debug, Default)]
struct Payments {
    /// Per `(caller, key)`: executions whose effect may have happened (an answer, a
    /// definitive failure, a panic, or an execution dropped before it ended). A retriable
    /// failure is the tool's word that nothing happened.
    effects: HashMap<(String, String), u32>,
}

/// Counts a payment's execution as an effect unless it ends with a retriable failure.
struct Execution {
    payments: Arc<Mutex<Payments>>,
    id: (String, String),
    no_effect: bool,
}

impl Drop for Execution {
    fn drop(&mut self) {
        if !self.no_effect {
            let mut p = self.payments.lock().unwrap_or_else(|e| e.into_inner());
            *p.effects.entry(self.id.clone()).or_default() += 1;
        }
    }
}

fn tool(name: &'static str, rng: &Arc<Mutex<Rng>>, payments: &Arc<Mutex<Payments>>) -> BoxTool {
    let (rng, payments) = (Arc::clone(rng), Arc::clone(payments));
    let executions = Arc::new(AtomicU64::new(0));
    BoxTool::new(service_fn(move |req: ToolRequest| {
        let behaviour = draw(&mut rng.lock().unwrap_or_else(|e| e.into_inner()));
        let n = executions.fetch_add(1, Ordering::SeqCst);
        let caller = req.meta().caller_id.as_deref().unwrap_or("").to_owned();
        let output = json!({
            "tool": name,
            "caller": caller,
            "payload": req.payload().clone(),
            "execution": n,
        });
        let mut execution = (name == "pay").then(|| Execution {
            payments: Arc::clone(&payments),
            id: (
                caller,
                idempotency_key_of(&req).unwrap_or("(none)").to_owned(),
            ),
            no_effect: false,
        });
        async move {
            match behaviour {
                Behaviour::Answer(wait) => {
                    tokio::time::sleep(wait).await;
                    Ok(ToolResponse::new(output))
                }
                Behaviour::Fail(kind, wait) => {
                    tokio::time::sleep(wait).await;
                    if let Some(e) = execution.as_mut() {
                        e.no_effect = kind.is_retriable();
                    }
                    Err(ToolError::new(kind, "the tool failed"))
                }
                Behaviour::Panic => panic!("the tool panicked"),
                Behaviour::Hang => std::future::pending().await,
            }
        }
    }))
}

/// One caller's call, as drawn.
#[derive(Debug, Clone)]
struct Call {
    tool: &'static str,
    caller: &'static str,
    payload: Value,
    key: Option<String>,
    start: Duration,
    /// Cancel the call's token this long after it starts.
    cancel_after: Option<Duration>,
    /// Drop the call this long after it starts.
    drop_after: Option<Duration>,
}

fn draw_call(rng: &mut Rng) -> Call {
    let tool = TOOLS[rng.below(3) as usize];
    let caller = CALLERS[rng.below(3) as usize];
    let order = rng.below(4);
    // Mostly one payload per key; sometimes another payload under a used key.
    let amount = if rng.below(10) == 0 {
        order + 100
    } else {
        order
    };
    let payload = json!({ "order": order, "amount": amount });
    let key = (tool == "pay" && rng.below(5) != 0).then(|| format!("order-{order}"));
    let maybe = |rng: &mut Rng| (rng.below(6) == 0).then(|| rng.millis(4_000));
    Call {
        tool,
        caller,
        payload,
        key,
        start: rng.millis(8_000),
        cancel_after: maybe(rng),
        drop_after: maybe(rng),
    }
}

/// What a caller was told.
#[derive(Debug)]
enum Told {
    Dropped,
    Answer(Value),
    Error(ErrorKind),
}

fn request(call: &Call, token: CancellationToken) -> ToolRequest {
    let kind = if call.tool == "pay" {
        CallKind::Mutating
    } else {
        CallKind::ReadOnly
    };
    let mut req = ToolRequest::new(call.tool, call.payload.clone())
        .kind(kind)
        .caller(call.caller)
        .cancel_token(token);
    if let Some(key) = &call.key {
        req = req.idempotency_key(key.as_str());
    }
    req
}

async fn run(seed: u64) -> (usize, HashMap<&'static str, usize>) {
    let rng = Arc::new(Mutex::new(Rng::new(seed)));
    let payments = Arc::new(Mutex::new(Payments::default()));
    let exporter = toolshield::metrics::local_prometheus();
    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG).expect("config"))
        .expect("shield")
        .with_metrics(&exporter)
        .expect("metrics");
    let mut builder = shield.router();
    for name in TOOLS {
        builder = builder.tool(name, tool(name, &rng, &payments));
    }
    let router = builder.build().expect("router");

    let calls: Vec<Call> = {
        let mut rng = rng.lock().unwrap();
        (0..60).map(|_| draw_call(&mut rng)).collect()
    };
    let mut tasks = Vec::new();
    for call in calls.iter().cloned() {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(call.start).await;
            let token = CancellationToken::new();
            if let Some(after) = call.cancel_after {
                let token = token.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    token.cancel();
                });
            }
            let req = request(&call, token);
            let started = tokio::time::Instant::now();
            let fut = router.oneshot(req);
            let out = match call.drop_after {
                Some(after) if after < TOTAL => match tokio::time::timeout(after, fut).await {
                    Ok(out) => out,
                    Err(_) => return Told::Dropped,
                },
                _ => fut.await,
            };
            let took = started.elapsed();
            assert!(
                took <= TOTAL + Duration::from_millis(50),
                "seed {seed}: {call:?} took {took:?}, past its whole-call deadline"
            );
            match out {
                Ok(resp) => Told::Answer(resp.output),
                Err(e) => Told::Error(e.kind()),
            }
        }));
    }

    let mut told = Vec::new();
    for (call, task) in calls.iter().zip(tasks) {
        let outcome = task
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: a panic reached the caller of {call:?}: {e}"));
        told.push(outcome);
    }

    // 2. Every answer is for its own request.
    let mut unknown: HashSet<(String, String)> = HashSet::new();
    let mut kinds: HashMap<&'static str, usize> = HashMap::new();
    for (call, outcome) in calls.iter().zip(&told) {
        let label = match outcome {
            Told::Dropped => "dropped",
            Told::Answer(_) => "answer",
            Told::Error(kind) => kind.code(),
        };
        *kinds.entry(label).or_default() += 1;
        match outcome {
            Told::Answer(output) => {
                assert_eq!(output["tool"], call.tool, "seed {seed}: {call:?}");
                if call.tool != "pay" || call.key.is_none() {
                    assert_eq!(output["payload"], call.payload, "seed {seed}: {call:?}");
                } else {
                    // A replay answers with the first payload's result, never another
                    // payload's under the same key.
                    assert_eq!(
                        output["payload"]["order"], call.payload["order"],
                        "seed {seed}: {call:?} got another key's result"
                    );
                }
                if call.tool != "plain" {
                    assert_eq!(
                        output["caller"], call.caller,
                        "seed {seed}: {call:?} got another caller's result"
                    );
                }
            }
            Told::Error(ErrorKind::OutcomeUnknown) => {
                if let Some(key) = &call.key {
                    unknown.insert((call.caller.to_owned(), key.clone()));
                }
            }
            _ => {}
        }
    }

    // 3. A payment under one key of one caller takes effect at most once.
    {
        let p = payments.lock().unwrap();
        for (id, n) in &p.effects {
            if id.1 == "(none)" || unknown.contains(id) {
                continue;
            }
            assert!(
                *n <= 1,
                "seed {seed}: {n} effects of payment {id:?}, and no caller of it was told \
                 the outcome is unknown"
            );
        }
    }

    // 4. Nothing is left held: wait out the breakers, then the bulkhead admits its three
    //    calls at once and a new key pays.
    tokio::time::sleep(Duration::from_secs(30)).await;
    *rng.lock().unwrap() = Rng::new(u64::MAX); // draws that answer (checked below)
    let fresh = |n: u64, caller: &'static str| {
        ToolRequest::new("read", json!({ "fresh": n, "seed": seed }))
            .kind(CallKind::ReadOnly)
            .caller(caller)
    };
    let after: Vec<_> = (0..3)
        .map(|n| tokio::spawn(router.clone().oneshot(fresh(n, CALLERS[n as usize]))))
        .collect();
    for task in after {
        let out = task.await.expect("no panic");
        assert!(
            !matches!(&out, Err(e) if e.kind() == ErrorKind::Overloaded),
            "seed {seed}: a bulkhead slot was never given back: {out:?}"
        );
    }
    let pay = ToolRequest::new("pay", json!({ "order": 99 }))
        .kind(CallKind::Mutating)
        .caller("dave")
        .idempotency_key(format!("after-{seed}"));
    let out = router.clone().oneshot(pay).await;
    assert!(
        !matches!(&out, Err(e) if matches!(e.kind(), ErrorKind::InProgress | ErrorKind::StoreUnavailable)),
        "seed {seed}: a new key is held: {out:?}"
    );

    // 5. The exposition stays valid.
    let text = exporter.render();
    if let Err(e) = toolshield_test::exposition::parse(&text) {
        panic!("seed {seed}: invalid exposition: {e}\n{text}");
    }
    (told.len(), kinds)
}

fn seeds() -> std::ops::Range<u64> {
    let n = toolshield_test::seeds_from_env("TOOLSHIELD_SHIELD_SEEDS", 24);
    1..1 + n
}

#[tokio::test(start_paused = true)]
async fn the_whole_shield_keeps_its_promises_under_random_faults_cancellations_and_drops() {
    let mut totals: HashMap<&'static str, usize> = HashMap::new();
    let mut calls = 0;
    for seed in seeds() {
        let (n, kinds) = run(seed).await;
        calls += n;
        for (k, v) in kinds {
            *totals.entry(k).or_default() += v;
        }
    }
    let mut totals: Vec<_> = totals.into_iter().collect();
    totals.sort();
    println!("{calls} calls: {totals:?}");
    // The run reached the cases it is about.
    let seen = |k: &str| totals.iter().any(|(label, n)| *label == k && *n > 0);
    for k in ["answer", "dropped", "CANCELLED", "TIMEOUT"] {
        assert!(seen(k), "no call ended {k}: {totals:?}");
    }
}
