//! The generic toolshield layers around `reqwest::Client`: a local flaky axum server is
//! started in-process and called through retry > breaker > attempt timeout >
//! `toolshield_reqwest::Client`. It shows two 503s retried away, a 429 whose
//! `Retry-After` is honoured, a 429 asking for longer than the stack waits (returned as
//! `RATE_LIMITED` with its wait), and a slow endpoint cut by the attempt timeout.
//!
//! Run it with `cargo run --example reqwest_client`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tower::{ServiceBuilder, ServiceExt};

use toolshield::breaker::{BreakerConfig, BreakerLayer, BreakerRegistry};
use toolshield::core::ErrorKind;
use toolshield::retry::{BackoffStrategy, RetryConfig, RetryLayer};
use toolshield::timeout::TimeoutLayer;

/// How often each endpoint was hit.
#[derive(Default)]
struct Hits {
    burst: AtomicU32,
    quota: AtomicU32,
    slow: AtomicU32,
}

type Shared = State<Arc<Hits>>;

async fn burst(State(hits): Shared) -> Response {
    if hits.burst.fetch_add(1, Ordering::SeqCst) < 2 {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        "back up".into_response()
    }
}

async fn quota(State(hits): Shared) -> Response {
    if hits.quota.fetch_add(1, Ordering::SeqCst) == 0 {
        (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response()
    } else {
        "quota ok".into_response()
    }
}

async fn closed() -> Response {
    (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "3600")]).into_response()
}

async fn slow(State(hits): Shared) -> Response {
    hits.slow.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    "too late".into_response()
}

/// Fails the example (exit code 1) with `what` when `ok` is false.
fn expect(ok: bool, what: &str) -> Result<(), Box<dyn std::error::Error>> {
    if ok {
        Ok(())
    } else {
        Err(format!("unexpected: {what}").into())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hits = Arc::new(Hits::default());
    let app = Router::new()
        .route("/burst", get(burst))
        .route("/quota", get(quota))
        .route("/closed", get(closed))
        .route("/slow", get(slow))
        .with_state(Arc::clone(&hits));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    println!("flaky server listening on {base}\n");

    // retry (3 attempts, 50-100 ms apart) > breaker per host > 500 ms per attempt > reqwest
    let retry = RetryLayer::from_config(&RetryConfig {
        max_attempts: 3,
        backoff: BackoffStrategy::fixed_range(
            Duration::from_millis(50),
            Duration::from_millis(100),
        ),
        max_retry_after: Duration::from_secs(10),
        ..RetryConfig::default()
    })?;
    let breaker = BreakerLayer::new(BreakerRegistry::new(BreakerConfig::default())?);
    let client = ServiceBuilder::new()
        .layer(retry)
        .layer(breaker)
        .layer(TimeoutLayer::new(Duration::from_millis(500)))
        .service(toolshield_reqwest::Client::new(reqwest::Client::new()));
    let get = |path: &str| {
        axum::http::Request::get(format!("{base}{path}")).body(axum::body::Bytes::new())
    };

    // 1. Two 503s in a row -> retried until the server is back.
    let res = client.clone().oneshot(get("/burst")?).await?;
    println!(
        "GET /burst: 503, 503, then {} \"{}\" ({} requests)",
        res.status(),
        String::from_utf8_lossy(res.body()),
        hits.burst.load(Ordering::SeqCst)
    );
    expect(
        res.status() == 200 && hits.burst.load(Ordering::SeqCst) == 3,
        "/burst",
    )?;

    // 2. 429 with Retry-After: 1 -> the retry waits the second the server asked for.
    let started = Instant::now();
    let res = client.clone().oneshot(get("/quota")?).await?;
    let waited = started.elapsed();
    println!(
        "GET /quota: 429 with Retry-After: 1, retried {:.1} s later, then {}",
        waited.as_secs_f64(),
        res.status()
    );
    expect(
        res.status() == 200 && waited >= Duration::from_millis(950),
        "/quota",
    )?;

    // 3. 429 with Retry-After: 3600 -> longer than the stack waits: returned at once,
    //    and `error_for_status` gives the caller (or the model) RATE_LIMITED with the wait.
    let res = client.clone().oneshot(get("/closed")?).await?;
    let err = match toolshield_reqwest::error_for_status(res) {
        Ok(res) => return Err(format!("unexpected: /closed answered {}", res.status()).into()),
        Err(err) => err,
    };
    println!(
        "GET /closed: {} with retry_after {:?}; the agent reads: {}",
        err.code(),
        err.retry_after(),
        err.for_model("quota-api")
    );
    expect(
        err.kind() == ErrorKind::RateLimited
            && err.retry_after() == Some(Duration::from_secs(3600)),
        "/closed",
    )?;

    // 4. A slow endpoint -> each attempt is cut at 500 ms; the call fails with TIMEOUT.
    let started = Instant::now();
    match client.clone().oneshot(get("/slow")?).await {
        Ok(res) => return Err(format!("unexpected: /slow answered {}", res.status()).into()),
        Err(e) => {
            println!(
                "GET /slow: {} after {} attempts of 500 ms ({:.1} s in all)",
                e.code(),
                e.attempts(),
                started.elapsed().as_secs_f64()
            );
            expect(e.kind() == ErrorKind::Timeout && e.attempts() == 3, "/slow")?;
        }
    }
    Ok(())
}
