//! The exactly-once checker on the wire: mutating calls through the full shield to a real
//! HTTP server on 127.0.0.1 that takes effect and then drops the connection, answers 503,
//! drops before doing anything, or answers; and to a real (in-process) MCP server that
//! takes effect and then dies mid-call, dies first, fails, or answers.
//!
//! The server is deliberately naive: it does not deduplicate. Per order it asserts:
//! 1. at most one effect, unless a caller was told `OUTCOME_UNKNOWN` (or `unrecorded`),
//!    or the effect belongs to a caller that gave up;
//! 2. (HTTP) a request repeated on the wire carries the same, non-empty `Idempotency-Key`
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

    let shield = shield();
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
                let (start, patience) = timing(&mut g);
                tasks.push(caller(router.clone(), req, order.clone(), start, patience));
            }
        }
    }
    let results = join(tasks).await;
    server.abort();
    record_and_check(&ledger, results, |out| out["body"].clone())
}

/// The shield both transports are called through: a mutating `pay` tool, retried.
fn shield() -> Shield {
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
    Shield::from_config(config).expect("shield")
}

/// When a caller starts, and how long it waits before it gives up (15 % give up soon).
fn timing(g: &mut fastrand::Rng) -> (Duration, Duration) {
    let start = Duration::from_millis(g.u64(0..300));
    let patience = if g.u32(0..100) < 15 {
        Duration::from_millis(g.u64(0..50))
    } else {
        Duration::from_secs(20)
    };
    (start, patience)
}

/// One caller of `order`: waits `start`, then calls `svc`, giving up after `patience`.
fn caller<S>(
    svc: S,
    req: ToolRequest,
    order: String,
    start: Duration,
    patience: Duration,
) -> tokio::task::JoinHandle<CallerResult>
where
    S: tower::Service<ToolRequest, Response = ToolResponse, Error = ToolError> + Send + 'static,
    S::Future: Send,
{
    tokio::spawn(async move {
        tokio::time::sleep(start).await;
        (
            order,
            tokio::time::timeout(patience, svc.oneshot(req)).await,
        )
    })
}

/// Every caller's result, once the clean-ups of callers that gave up have run.
async fn join(tasks: Vec<tokio::task::JoinHandle<CallerResult>>) -> Vec<CallerResult> {
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("caller task"));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    results
}

/// What each caller of an order got: its result, or `Err` when it gave up.
type CallerResult = (
    String,
    Result<Result<ToolResponse, ToolError>, tokio::time::error::Elapsed>,
);

/// Records what each caller got and checks every order; `effect_of` finds the server's
/// effect in a response's output.
fn record_and_check(
    ledger: &Ledger,
    results: Vec<CallerResult>,
    effect_of: impl Fn(&Value) -> Value,
) -> Vec<String> {
    for (order, out) in results {
        let what = match &out {
            Err(_) => "gave up".to_owned(),
            Ok(Ok(r)) => format!(
                "ok {} replayed={}",
                effect_of(&r.output),
                r.provenance.replayed
            ),
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
                    let effect = effect_of(&r.output);
                    if !r.provenance.replayed && !o.fresh.contains(&effect) {
                        o.fresh.push(effect);
                    }
                }
                Ok(Err(e)) if e.kind() == ErrorKind::OutcomeUnknown => o.told_unknown = true,
                Ok(Err(_)) => {}
            }
        });
    }

    let mut violations = Vec::new();
    let orders = ledger.orders.lock().unwrap_or_else(|e| e.into_inner());
    let calls: usize = orders.values().map(|o| o.outcomes.len()).sum();
    let effects: usize = orders.values().map(|o| o.effects.len()).sum();
    let unknown = orders
        .values()
        .flat_map(|o| &o.outcomes)
        .filter(|w| w.starts_with("OUTCOME_UNKNOWN"))
        .count();
    let gave_up: usize = orders.values().map(|o| o.gave_up).sum();
    let sent: usize = orders.values().map(|o| o.keys.len()).sum();
    println!(
        "{} orders, {calls} calls, {sent} HTTP requests received, {effects} effects, \
         {unknown} OUTCOME_UNKNOWN, {gave_up} callers gave up",
        orders.len()
    );
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

// ----- MCP: a server that dies mid-call -----

mod mcp {
    use super::*;
    use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult};
    use rmcp::service::{RequestContext, RoleServer};
    use rmcp::{ErrorData, ServerHandler, ServiceExt as _};
    use tokio_util::sync::CancellationToken;
    use toolshield_mcp::McpClientService;

    /// A naive payment server over MCP: it takes effect, then may die before answering.
    #[derive(Clone)]
    struct PayServer {
        ledger: Arc<Ledger>,
        rng: Arc<Mutex<fastrand::Rng>>,
        kill: CancellationToken,
    }

    impl ServerHandler for PayServer {
        async fn call_tool(
            &self,
            req: CallToolRequestParams,
            _cx: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, ErrorData> {
            let args = Value::from(req.arguments.clone().unwrap_or_default());
            let order = args["order"].as_str().unwrap_or("?").to_owned();
            let roll = self
                .rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .u32(0..100);
            let effect = || {
                let id = self.ledger.next_effect.fetch_add(1, Ordering::SeqCst);
                let out = json!({"order": order, "effect": id});
                self.ledger.with(&order, |o| o.effects.push(out.clone()));
                out
            };
            match roll {
                // The charge is made, then the server dies before it answers.
                0..=19 => {
                    effect();
                    self.kill.cancel();
                    std::future::pending().await
                }
                // The server dies before doing anything.
                20..=27 => {
                    self.kill.cancel();
                    std::future::pending().await
                }
                28..=42 => Err(ErrorData::internal_error("busy", None)),
                _ => Ok(CallToolResult::structured(effect()).into()),
            }
        }
    }

    /// A fresh in-process server and a client connected to it (a dead server cannot be
    /// called again, so every call gets its own connection; the shield, and so the
    /// idempotency store, is shared).
    async fn connect(ledger: &Arc<Ledger>, rng: &Arc<Mutex<fastrand::Rng>>) -> McpClientService {
        let server = PayServer {
            ledger: Arc::clone(ledger),
            rng: Arc::clone(rng),
            kill: CancellationToken::new(),
        };
        let kill = server.kill.clone();
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(running) = server.serve(server_io).await {
                tokio::select! {
                    _ = running.waiting() => {}
                    () = kill.cancelled() => {}
                }
            }
        });
        McpClientService::connect(client_io)
            .await
            .expect("client connects to the in-process server")
    }

    pub(super) async fn run(seed: u64) -> Vec<String> {
        let ledger = Arc::new(Ledger::default());
        let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
        let shield = shield();
        let mut tasks = Vec::new();
        for k in 0..30 {
            let order = format!("mcp-order-{seed}-{k}");
            let (n, keyed) = {
                let mut g = rng.lock().unwrap_or_else(|e| e.into_inner());
                (g.usize(1..=4), g.bool())
            };
            let mut original = ToolRequest::new("pay", json!({"order": order}))
                .kind(CallKind::Mutating)
                .caller("agent");
            if keyed {
                original = original.idempotency_key(order.clone());
            }
            for _ in 0..n {
                let (clone, (start, patience)) = {
                    let mut g = rng.lock().unwrap_or_else(|e| e.into_inner());
                    (g.bool(), timing(&mut g))
                };
                let req = if clone {
                    original.clone()
                } else {
                    let fresh = ToolRequest::new("pay", json!({"order": order}))
                        .kind(CallKind::Mutating)
                        .caller("agent");
                    if keyed {
                        fresh.idempotency_key(order.clone())
                    } else {
                        fresh
                    }
                };
                let client = connect(&ledger, &rng).await;
                let svc = shield.wrap("pay", client);
                tasks.push(caller(svc, req, order.clone(), start, patience));
            }
        }
        let results = join(tasks).await;
        record_and_check(&ledger, results, |out| out["structuredContent"].clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutation_runs_at_most_once_when_connections_break_after_the_request_was_sent() {
    let seeds = toolshield_test::seeds_from_env("TOOLSHIELD_CHECKER_WIRE_SEEDS", 3);
    let mut all = Vec::new();
    for seed in 1..=seeds {
        all.extend(run(seed).await);
        all.extend(mcp::run(seed).await);
    }
    assert!(
        all.is_empty(),
        "at-most-once on the wire violated:\n{}",
        all.join("\n")
    );
}
