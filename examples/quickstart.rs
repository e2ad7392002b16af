//! The quickstart: an agent calls flaky tools through the toolshield stack on in-memory
//! defaults and prints, in plain words, what happened to each call and where each result
//! came from.
//!
//! Run it with `cargo run --example quickstart`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;
use toolshield::breaker::CircuitState;
use toolshield::config::ShieldConfig;
use toolshield::prelude::*;
use toolshield::shield::{BoxTool, Shield, ToolRouter};
use tower::{service_fn, BoxError, ServiceExt};

/// The stack's settings: defaults, then one section per tool.
const CONFIG: &str = r#"
[defaults]
timeout = { attempt = "500ms", soft = "200ms" }
retry = { max_attempts = 3, backoff = { strategy = "exponential", base = "100ms", factor = 2.0, cap = "1s" } }
breaker = { consecutive_failures = 3, open_wait = "1s" }

[tools.search]
kind = "read_only"

[tools.flaky_api]
kind = "read_only"
retry = { max_attempts = 4, rate_limit_backoff = "1s" }

[tools.weather]
kind = "read_only"
cache = { ttl = "5m" }

[tools.pay]
kind = "mutating"

# An agent may call `lookup` 3 times per run: a model stuck in a loop is stopped and told why.
[tools.lookup]
kind = "read_only"
budget = { max_calls = 3 }
"#;

/// A tool whose behaviour is scripted by call number, so the demo shows every path
/// without depending on luck.
fn scripted<F, Fut>(script: F) -> (BoxTool, Arc<AtomicU32>)
where
    F: Fn(u32, ToolRequest) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<ToolResponse, ToolError>> + Send + 'static,
{
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let svc = BoxTool::new(service_fn(move |req: ToolRequest| {
        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
        script(n, req)
    }));
    (svc, calls)
}

/// Answers after `delay`, unless the attempt is cancelled first.
async fn work(req: &ToolRequest, delay: Duration) -> Result<(), ToolError> {
    tokio::select! {
        _ = tokio::time::sleep(delay) => Ok(()),
        _ = req.attempt_token().cancelled() => Err(ToolError::cancelled("stopped")),
    }
}

fn where_from(p: &Provenance) -> String {
    let source = if p.cache_hit {
        "from the cache"
    } else if p.replayed {
        "replayed from the idempotency store (the tool did not run again)"
    } else {
        "fresh from the tool"
    };
    let mut s = format!("{source}, {} attempt(s)", p.attempts.max(1));
    if p.slow {
        s.push_str(", marked slow");
    }
    if let Some(at) = p.fetched_at {
        s.push_str(&format!(", fetched at {}", at.format("%H:%M:%S%.3f")));
    }
    s
}

async fn call(
    router: &ToolRouter,
    label: &str,
    req: ToolRequest,
) -> Result<ToolResponse, ToolError> {
    let tool = req.tool().to_owned();
    let start = Instant::now();
    let result = router.clone().oneshot(req).await;
    let ms = start.elapsed().as_millis();
    match &result {
        Ok(res) => println!(
            "  {label:<34} ok in {ms} ms: {} ({})",
            res.output,
            where_from(&res.provenance)
        ),
        Err(e) => {
            let what = match e.kind() {
                ErrorKind::Timeout => "timed out",
                ErrorKind::Cancelled => "cancelled",
                ErrorKind::CircuitOpen => "rejected at once, breaker open",
                ErrorKind::BudgetExhausted => "refused, the run's budget is spent",
                _ => "failed",
            };
            let attempts = match e.attempts() {
                0 | 1 => String::new(),
                n => format!(" and {n} attempts"),
            };
            println!(
                "  {label:<34} {what} after {ms} ms{attempts} [{}]",
                e.code()
            );
            println!("  {:<34} the model reads: \"{}\"", "", e.for_model(&tool));
        }
    }
    result
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    println!("toolshield quickstart: one agent, flaky tools, in-memory defaults\n");
    // Metrics go to a Prometheus exporter this demo renders at the end (a service would
    // serve it on /metrics through toolshield-axum).
    let exporter = toolshield_metrics::local_prometheus();
    let shield =
        Shield::from_config(ShieldConfig::from_toml_str(CONFIG)?)?.with_metrics(&exporter)?;

    let (search, _) = scripted(|n, req| async move {
        match n {
            1 => work(&req, Duration::from_millis(40)).await?,
            2 => work(&req, Duration::from_millis(250)).await?, // past the soft threshold
            _ => work(&req, Duration::from_secs(5)).await?,     // hangs until cancelled
        }
        Ok(ToolResponse::new(json!({"hits": 3})))
    });
    let (flaky, flaky_calls) = scripted(|n, _req| async move {
        match n {
            1 | 2 => Err(ToolError::new(
                ErrorKind::UpstreamUnavailable,
                "503 from the api",
            )),
            3 => Err(ToolError::rate_limited(
                "429 from the api",
                Some(Duration::from_secs(1)),
            )),
            _ => Ok(ToolResponse::new(json!({"rows": 42}))),
        }
    });
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = healthy.clone();
    let (weather, weather_calls) = scripted(move |_n, req| {
        let up = h.load(Ordering::SeqCst);
        async move {
            if !up && req.payload()["city"] != json!("Paris") {
                return Err(ToolError::new(
                    ErrorKind::ConnectionFailed,
                    "weather api unreachable",
                ));
            }
            Ok(ToolResponse::new(
                json!({"city": req.payload()["city"], "temp_c": 21}),
            ))
        }
    });
    let (pay, pay_calls) = scripted(|n, _req| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(ToolResponse::new(json!({"charge_id": format!("ch_{n}")})))
    });

    let (lookup, _) = scripted(|n, _req| async move { Ok(ToolResponse::new(json!({"page": n}))) });

    let router = shield
        .router()
        .tool("search", search)
        .tool("flaky_api", flaky)
        .tool("weather", weather)
        .tool("pay", pay)
        .tool("lookup", lookup)
        .build()?;
    let read =
        |tool: &str, payload: Value| ToolRequest::new(tool, payload).kind(CallKind::ReadOnly);

    println!("1. timeouts and cancellation (attempt timeout 500 ms, soft threshold 200 ms)");
    call(
        &router,
        "quick answer",
        read("search", json!({"q": "rust"})),
    )
    .await
    .ok();
    call(
        &router,
        "slow answer",
        read("search", json!({"q": "tower"})),
    )
    .await
    .ok();
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        t.cancel();
    });
    let cancelled = call(
        &router,
        "user cancels after 100 ms",
        read("search", json!({"q": "long"})).cancel_token(token),
    )
    .await;
    println!(
        "  {:<34} the never-throw envelope: {}",
        "",
        serde_json::to_string(&ToolResult::from(cancelled))?
    );

    println!("\n2. retries: two 503s, then a 429 asking for 1 s, then success");
    let mut events = shield.breaker_for("flaky_api").subscribe();
    call(&router, "flaky api", read("flaky_api", json!({"q": 1})))
        .await
        .ok();
    println!(
        "  {:<34} the api was called {} times for one logical call",
        "",
        flaky_calls.load(Ordering::SeqCst)
    );
    // The breaker counts attempts, not calls: what it did during this one call.
    let mut path = vec![shield
        .breaker_for("flaky_api")
        .state("flaky_api")
        .to_string()];
    let mut opened = false;
    while let Ok(event) = events.try_recv() {
        if &*event.key == "flaky_api" {
            if path.len() == 1 {
                path[0] = event.from.to_string();
            }
            opened |= event.to == CircuitState::Open;
            path.push(event.to.to_string());
        }
    }
    println!("  {:<34} its breaker went {}", "", path.join(" -> "));
    if opened {
        println!(
            "  {:<34} three failed attempts in a row opened it (open for 1 s); the retry",
            ""
        );
        println!(
            "  {:<34} waited the 1 s the 429 asked for, as long as the breaker stays open,",
            ""
        );
        println!(
            "  {:<34} so the 4th attempt found it half-open and went through as its probe;",
            ""
        );
        println!(
            "  {:<34} the success closed it. A shorter wait would have met the open breaker",
            ""
        );
        println!(
            "  {:<34} and ended the call with CIRCUIT_OPEN, which is never retried.",
            ""
        );
    }

    println!("\n3. cache: the same lookup twice");
    call(
        &router,
        "weather in Paris",
        read("weather", json!({"city": "Paris"})),
    )
    .await
    .ok();
    call(
        &router,
        "weather in Paris again",
        read("weather", json!({"city": "Paris"})),
    )
    .await
    .ok();

    println!("\n4. circuit breaker: the weather api goes down (3 failed attempts open it for 1 s)");
    for city in ["Lyon", "Nice", "Lille"] {
        call(
            &router,
            &format!("weather in {city}"),
            read("weather", json!({"city": city})),
        )
        .await
        .ok();
    }
    let before = weather_calls.load(Ordering::SeqCst);
    call(
        &router,
        "weather in Brest",
        read("weather", json!({"city": "Brest"})),
    )
    .await
    .ok();
    println!(
        "  {:<34} the api was not called: {}",
        "",
        weather_calls.load(Ordering::SeqCst) == before
    );
    call(
        &router,
        "weather in Paris (cached)",
        read("weather", json!({"city": "Paris"})),
    )
    .await
    .ok();
    healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    call(
        &router,
        "after 1 s, the api is back",
        read("weather", json!({"city": "Brest"})),
    )
    .await
    .ok();
    println!(
        "  {:<34} breaker for `weather` is {}",
        "",
        shield.breaker_for("weather").state("weather")
    );

    println!("\n5. idempotency: a payment sent twice, then 10 times at once");
    let payment = |key: &str| {
        ToolRequest::new("pay", json!({"amount": 4200, "currency": "EUR"})).idempotency_key(key)
    };
    let before = pay_calls.load(Ordering::SeqCst);
    call(&router, "pay order-7", payment("order-7")).await.ok();
    call(&router, "pay order-7 again", payment("order-7"))
        .await
        .ok();
    println!(
        "  {:<34} the payment tool ran {} time(s) for order-7",
        "",
        pay_calls.load(Ordering::SeqCst) - before
    );
    let before = pay_calls.load(Ordering::SeqCst);
    let at_once = (0..10).map(|_| router.clone().oneshot(payment("order-8")));
    let results = futures_join_all(at_once).await;
    // Every one of the ten: a task that panicked counts as a failure, not as absent.
    let outputs: Vec<Value> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|r| r.output.clone()))
        .collect();
    let mut answers: Vec<&Value> = Vec::new();
    for output in &outputs {
        if !answers.contains(&output) {
            answers.push(output);
        }
    }
    let summary = match (outputs.len(), answers.as_slice()) {
        (0, _) => "none succeeded".to_owned(),
        (10, [output]) => format!("all 10 got {output}"),
        (n, [output]) => format!("{n} of 10 succeeded, all with {output}"),
        (n, _) => format!(
            "{n} of 10 succeeded, with {} different answers",
            answers.len()
        ),
    };
    println!(
        "  {:<34} 10 callers, {summary}; the payment tool ran {} time(s) for order-8",
        "pay order-8 x10 concurrently",
        pay_calls.load(Ordering::SeqCst) - before
    );

    println!("\n6. a run's call budget: the agent keeps calling `lookup` (3 calls per run)");
    for i in 1..=4 {
        let req = read("lookup", json!({ "q": i })).run_id("run-1");
        call(&router, &format!("lookup #{i} in run-1"), req)
            .await
            .ok();
    }
    let req = read("lookup", json!({"q": 1})).run_id("run-2");
    call(&router, "lookup #1 in run-2", req).await.ok();

    println!("\nmetrics summary (from the Prometheus exposition):");
    let text = exporter.render();
    for line in text.lines().filter(|l| {
        (l.starts_with("tool_execution_total")
            || l.starts_with("tool_retries_total")
            || l.starts_with("tool_cache_hits_total")
            || l.starts_with("idempotency_cache_hits_total")
            || l.starts_with("tool_budget_exhausted_total")
            || l.starts_with("circuit_breaker_transitions_total"))
            && !l.ends_with(" 0")
    }) {
        println!("  {line}");
    }
    println!("\nevery call ended with a clear outcome.");
    Ok(())
}

/// Runs the futures concurrently and collects their outputs in order.
async fn futures_join_all<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}
