//! The exactly-once checker on the wire: mutating HTTP calls through the full shield to a
//! real server on 127.0.0.1 that takes effect and then drops the connection, answers
//! 503, drops before doing anything, or answers.
//!
//! The server is deliberately naive: it does not deduplicate. Per order it asserts:
//! 1. at most one effect, unless a caller was told `OUTCOME_UNKNOWN` (or `unrecorded`),
//!    or the effect belongs to a caller that gave up;
//! 2. a request repeated on the wire carries the same, non-empty `Idempotency-Key`
//!    header every time, so a server that deduplicates can (the derived key is sent too);
//! 3. every caller gets the output of a real effect, or a typed error of an expected kind.
//!
//! CI runs a fixed set of seeds; `TOOLSHIELD_CHECKER_WIRE_SEEDS=200` runs more.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toolshield::prelude::*;
use toolshield_http::{http_tool_request, HttpTool};
use tower::ServiceExt;

/// What the server saw for one order.
#[derive(Debug, Default)]
struct Order {
    /// The `Idempotency-Key` header of every request that reached the server.
    keys: Vec<Option<String>>,
    effects: Vec<Value>,
    told_unknown: bool,
    gave_up: usize,
    fresh: Vec<Value>,
    outcomes: Vec<String>,
}

#[derive(Default)]
struct Ledger {
    orders: Mutex<HashMap<String, Order>>,
    next_effect: AtomicU64,
}

impl Ledger {
    fn with<R>(&self, order: &str, f: impl FnOnce(&mut Order) -> R) -> R {
        let mut orders = self.orders.lock().unwrap_or_else(|e| e.into_inner());
        f(orders.entry(order.to_owned()).or_default())
    }
}

/// Reads one HTTP/1.1 request: its `Idempotency-Key` header and its JSON body.
async fn read_request(sock: &mut TcpStream) -> Option<(Option<String>, Value)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut len = 0usize;
    let mut key = None;
    for line in head.lines().skip(1) {
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                len = value.parse().ok()?;
            } else if name.eq_ignore_ascii_case("idempotency-key") {
                key = Some(value.to_owned());
            }
        }
    }
    while buf.len() < head_end + len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..head_end + len]).ok()?;
    Some((key, body))
}

/// A naive payment server: one request per connection, behaviour drawn per request.
async fn serve(listener: TcpListener, ledger: Arc<Ledger>, rng: Arc<Mutex<fastrand::Rng>>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let (ledger, rng) = (Arc::clone(&ledger), Arc::clone(&rng));
        tokio::spawn(async move {
            let Some((key, body)) = read_request(&mut sock).await else {
                return;
            };
            let order = body["order"].as_str().unwrap_or("?").to_owned();
            ledger.with(&order, |o| o.keys.push(key));
            let roll = rng.lock().unwrap_or_else(|e| e.into_inner()).u32(0..100);
            let effect = |ledger: &Ledger| {
                let id = ledger.next_effect.fetch_add(1, Ordering::SeqCst);
                let out = json!({"order": order, "effect": id});
                ledger.with(&order, |o| o.effects.push(out.clone()));
                out
            };
            let (status, out) = match roll {
                // The charge is made, then the connection breaks before the answer.
                0..=19 => {
                    effect(&ledger);
                    return;
                }
                // The connection breaks before anything is done.
                20..=27 => return,
                28..=42 => ("503 Service Unavailable", json!({"error": "busy"})),
                _ => ("200 OK", effect(&ledger)),
            };
            let body = out.to_string();
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(answer.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

async fn run(seed: u64) -> Vec<String> {
    let ledger = Arc::new(Ledger::default());
    let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(serve(listener, Arc::clone(&ledger), Arc::clone(&rng)));

    let config = ShieldConfig::from_toml_str(
        r#"
        [tools.pay]
        kind = "mutating"
        retry = { max_attempts = 3, backoff = { strategy = "none" } }
        timeout = { attempt = "5s" }
        idempotency = { lease = "2s", wait_timeout = "3s" }
        "#,
    )
    .expect("config");
    let shield = Shield::from_config(config).expect("shield");
    let router = shield
        .router()
        .tool("pay", HttpTool::new())
        .build()
        .expect("valid names");

    let mut tasks = Vec::new();
    {
        let mut g = rng.lock().unwrap_or_else(|e| e.into_inner());
        for k in 0..30 {
            let order = format!("order-{seed}-{k}");
            // One way to name the order for all its callers: a key of its own, or none
            // (the shield derives one from the payload).
            let keyed = g.bool();
            let mut payload = json!({
                "method": "POST",
                "url": format!("http://{addr}/pay"),
                "body": {"order": order},
            });
            if keyed {
                payload["headers"] = json!({"Idempotency-Key": order});
            }
            let original = http_tool_request("pay", payload.clone()).caller("agent");
            for _ in 0..g.usize(1..=4) {
                let req = if g.bool() {
                    original.clone()
                } else {
                    http_tool_request("pay", payload.clone()).caller("agent")
                };
                let router = router.clone();
                let start = Duration::from_millis(g.u64(0..300));
                let patience = if g.u32(0..100) < 15 {
                    Duration::from_millis(g.u64(0..50))
                } else {
                    Duration::from_secs(20)
                };
                let order = order.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(start).await;
                    (
                        order,
                        tokio::time::timeout(patience, router.oneshot(req)).await,
                    )
                }));
            }
        }
    }
    for t in tasks {
        let (order, out) = t.await.expect("caller task");
        let what = match &out {
            Err(_) => "gave up".to_owned(),
            Ok(Ok(r)) => format!("ok {} replayed={}", r.output["body"], r.provenance.replayed),
            Ok(Err(e)) => format!("{}: {}", e.code(), e.message()),
        };
        ledger.with(&order, |o| {
            o.outcomes.push(what);
            match out {
                Err(_) => o.gave_up += 1,
                Ok(Ok(r)) => {
                    if r.provenance.unrecorded {
                        o.told_unknown = true;
                    }
                    if !r.provenance.replayed && !o.fresh.contains(&r.output["body"]) {
                        o.fresh.push(r.output["body"].clone());
                    }
                }
                Ok(Err(e)) if e.kind() == ErrorKind::OutcomeUnknown => o.told_unknown = true,
                Ok(Err(_)) => {}
            }
        });
    }
    // Let clean-ups of callers that gave up finish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.abort();

    let mut violations = Vec::new();
    let orders = ledger.orders.lock().unwrap_or_else(|e| e.into_inner());
    for (order, o) in orders.iter() {
        let untold = o.effects.len().saturating_sub(o.fresh.len());
        if !o.told_unknown && (o.fresh.len() > 1 || untold > o.gave_up) {
            violations.push(format!(
                "{order}: {} effects, callers got {:?}",
                o.effects.len(),
                o.outcomes
            ));
        }
        if o.keys.len() > 1 {
            let first = o.keys[0].as_deref();
            if first.is_none_or(|k| k.trim().is_empty())
                || o.keys.iter().any(|k| k.as_deref() != first)
            {
                violations.push(format!(
                    "{order}: repeated on the wire without one key the server sees: {:?}",
                    o.keys
                ));
            }
        }
        for out in &o.fresh {
            if !o.effects.contains(out) {
                violations.push(format!(
                    "{order}: a caller got {out}, which no effect produced"
                ));
            }
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutation_runs_at_most_once_when_connections_break_after_the_request_was_sent() {
    let seeds = std::env::var("TOOLSHIELD_CHECKER_WIRE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4u64);
    let mut all = Vec::new();
    for seed in 1..=seeds {
        all.extend(run(seed).await);
    }
    assert!(
        all.is_empty(),
        "at-most-once on the wire violated:\n{}",
        all.join("\n")
    );
}
