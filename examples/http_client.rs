//! The toolshield stack around a real HTTP client: a local flaky axum server is started
//! in-process and called through `HttpTool` + the default stack. It shows a 429 with
//! `Retry-After` honoured, a burst of 503s retried away, a slow endpoint cut by the
//! attempt timeout, and a POST with an `Idempotency-Key` sent twice but executed once.
//!
//! Run it with `cargo run --example http_client`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_http::{http_tool_request, HttpTool};
use tower::ServiceExt;

/// The stack's settings for HTTP calls. Keys are not derived: only an
/// `Idempotency-Key` header makes a POST repeatable.
const CONFIG: &str = r#"
[defaults]
timeout = { attempt = "500ms", soft = "300ms" }
retry = { max_attempts = 3, backoff = { strategy = "fixed", min = "50ms", max = "100ms" } }
breaker = { consecutive_failures = 5, open_wait = "1s" }
idempotency = { derive_keys = false }
"#;

/// How often each endpoint was hit.
#[derive(Default)]
struct Hits {
    quota: AtomicU32,
    burst: AtomicU32,
    slow: AtomicU32,
    orders: AtomicU32,
}

type Shared = State<Arc<Hits>>;

async fn quota(State(hits): Shared) -> Response {
    if hits.quota.fetch_add(1, Ordering::SeqCst) == 0 {
        (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1")],
            "slow down",
        )
            .into_response()
    } else {
        Json(json!({"quota": "ok"})).into_response()
    }
}

async fn burst(State(hits): Shared) -> Response {
    if hits.burst.fetch_add(1, Ordering::SeqCst) < 2 {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        Json(json!({"status": "back up"})).into_response()
    }
}

async fn slow(State(hits): Shared) -> Response {
    hits.slow.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    "too late".into_response()
}

async fn orders(State(hits): Shared, Json(order): Json<Value>) -> Response {
    let n = hits.orders.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(200)).await;
    (
        StatusCode::CREATED,
        Json(json!({"order_no": n, "item": order["item"]})),
    )
        .into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hits = Arc::new(Hits::default());
    let app = Router::new()
        .route("/quota", get(quota))
        .route("/burst", get(burst))
        .route("/slow", get(slow))
        .route("/orders", post(orders))
        .with_state(Arc::clone(&hits));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    println!("flaky server listening on {base}\n");

    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG)?)?;
    let api = shield.wrap("http", HttpTool::new());

    // 1. 429 with Retry-After: 1 -> the retry waits the second the server asked for.
    let started = Instant::now();
    let res = api
        .clone()
        .oneshot(http_tool_request(
            "http",
            json!({"url": format!("{base}/quota")}),
        ))
        .await?;
    println!(
        "GET /quota: rate limited first, waited for Retry-After, then got {} after {} attempts in {:.1} s",
        res.output["status"],
        res.provenance.attempts,
        started.elapsed().as_secs_f64()
    );

    // 2. Two 503s in a row -> retried until the server is back.
    let res = api
        .clone()
        .oneshot(http_tool_request(
            "http",
            json!({"url": format!("{base}/burst")}),
        ))
        .await?;
    println!(
        "GET /burst: the server answered 503 twice, the third attempt got {} ({})",
        res.output["status"], res.output["body"]["status"]
    );

    // 3. A slow endpoint -> each attempt is cut at 500 ms; the call fails with TIMEOUT.
    let started = Instant::now();
    match api
        .clone()
        .oneshot(http_tool_request(
            "http",
            json!({"url": format!("{base}/slow")}),
        ))
        .await
    {
        Ok(res) => println!("GET /slow: unexpectedly answered {}", res.output["status"]),
        Err(e) => println!(
            "GET /slow: {} after {} attempts of 500 ms ({:.1} s in all); the agent reads: {}",
            e.code(),
            hits.slow.load(Ordering::SeqCst),
            started.elapsed().as_secs_f64(),
            e.for_model("http")
        ),
    }

    // 4. The same POST with an Idempotency-Key, sent twice at once -> executed once.
    let order = json!({
        "method": "POST",
        "url": format!("{base}/orders"),
        "headers": {"Idempotency-Key": "order-2026-0001"},
        "body": {"item": "book"},
    });
    let (a, b) = tokio::join!(
        api.clone()
            .oneshot(http_tool_request("http", order.clone())),
        api.clone().oneshot(http_tool_request("http", order)),
    );
    let (a, b) = (a?, b?);
    println!(
        "POST /orders twice with one Idempotency-Key: the server created {} order(s); both callers got order #{} (replayed: {} / {})",
        hits.orders.load(Ordering::SeqCst),
        a.output["body"]["order_no"],
        a.provenance.replayed,
        b.provenance.replayed
    );
    assert_eq!(hits.orders.load(Ordering::SeqCst), 1);
    Ok(())
}
