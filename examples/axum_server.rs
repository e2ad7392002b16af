//! toolshield protecting an axum service's own handlers: a breaker and a timeout on the
//! routes, and `ToolErrorResponseLayer` turning their errors into HTTP answers.
//!
//! `cargo run --example axum_server` starts the server on a free loopback port and calls
//! it as a client would:
//!
//! - `GET /flaky` fails (500) until its breaker opens, then answers 503 with
//!   `Retry-After` without running the handler; after the wait a probe finds it
//!   recovered and the breaker closes;
//! - `GET /slow` takes longer than the route's timeout and answers 504.
//!
//! It prints what it sees and exits 0 when everything happened as described, 1 otherwise.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use toolshield::breaker::{BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState};
use toolshield::timeout::TimeoutLayer;
use toolshield_axum::{HandlerClassifier, MatchedPathKey, ToolErrorResponseLayer};
use tower::ServiceBuilder;

const OPEN_WAIT: Duration = Duration::from_secs(1);
const ROUTE_TIMEOUT: Duration = Duration::from_millis(300);

/// The server: every route behind `ToolErrorResponseLayer > breaker > timeout`.
fn app(registry: &BreakerRegistry, failures_left: Arc<AtomicU32>) -> Router {
    let breaker = BreakerLayer::new(registry.clone())
        .key_fn(MatchedPathKey) // one breaker per route
        .classifier(HandlerClassifier); // a handler's 5xx and errors count, 4xx never
    Router::new()
        .route(
            "/flaky",
            get(move || {
                let left = Arc::clone(&failures_left);
                async move {
                    let failing = left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if failing {
                        (StatusCode::INTERNAL_SERVER_ERROR, "database down")
                    } else {
                        (StatusCode::OK, "fine")
                    }
                }
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route_layer(
            ServiceBuilder::new()
                .layer(ToolErrorResponseLayer::new())
                .layer(breaker)
                .layer(TimeoutLayer::new(ROUTE_TIMEOUT)),
        )
}

/// One answer, as the client saw it.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

fn get_url(agent: &ureq::Agent, url: &str) -> Result<Answer, ureq::Error> {
    let mut resp = agent.get(url).call()?;
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok(Answer {
        status: resp.status().as_u16(),
        retry_after,
        body: resp.body_mut().read_to_string()?,
    })
}

/// Records whether what happened is what should have.
struct Checks(Vec<String>);

impl Checks {
    fn expect(&mut self, ok: bool, what: &str) {
        if !ok {
            println!("  UNEXPECTED: {what}");
            self.0.push(what.to_owned());
        }
    }
}

/// The client's side: runs off the runtime (ureq blocks).
fn client(base: &str, registry: &BreakerRegistry) -> Result<Checks, ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut checks = Checks(Vec::new());
    let flaky = format!("{base}/flaky");
    let state = || format!("{:?}", registry.state("/flaky")).to_lowercase();

    for _ in 0..3 {
        let a = get_url(&agent, &flaky)?;
        println!(
            "GET /flaky -> {} {:?} (breaker {})",
            a.status,
            a.body,
            state()
        );
        checks.expect(a.status == 500, "/flaky fails with its own 500");
    }

    let a = get_url(&agent, &flaky)?;
    println!(
        "GET /flaky -> {} Retry-After: {} {} (breaker {}, handler not run)",
        a.status,
        a.retry_after.as_deref().unwrap_or("-"),
        a.body,
        state()
    );
    checks.expect(a.status == 503, "an open breaker answers 503");
    checks.expect(
        a.retry_after.as_deref() == Some("1"),
        "Retry-After is the 1 s wait, rounded up",
    );
    checks.expect(
        a.body.contains("CIRCUIT_OPEN"),
        "the body says CIRCUIT_OPEN",
    );

    let started = Instant::now();
    let a = get_url(&agent, &format!("{base}/slow"))?;
    println!(
        "GET /slow  -> {} after {:.2} s {}",
        a.status,
        started.elapsed().as_secs_f64(),
        a.body
    );
    checks.expect(
        a.status == 504,
        "a handler slower than its timeout answers 504",
    );
    checks.expect(
        started.elapsed() < Duration::from_secs(2),
        "the slow handler is cut at the timeout",
    );

    std::thread::sleep(OPEN_WAIT + Duration::from_millis(100));
    let a = get_url(&agent, &flaky)?;
    println!(
        "after the wait: GET /flaky -> {} {:?} (breaker {})",
        a.status,
        a.body,
        state()
    );
    checks.expect(
        a.status == 200,
        "the probe after the wait reaches the handler",
    );
    checks.expect(
        registry.state("/flaky") == CircuitState::Closed,
        "a successful probe closes the breaker",
    );
    Ok(checks)
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = BreakerConfig {
        consecutive_failures: 3,
        open_wait: OPEN_WAIT,
        ..BreakerConfig::default()
    };
    let registry = match BreakerRegistry::new(config) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("invalid breaker config: {e}");
            return ExitCode::FAILURE;
        }
    };

    // The handler fails three times, then works again.
    let app = app(&registry, Arc::new(AtomicU32::new(3)));
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on 127.0.0.1: {e}");
            return ExitCode::FAILURE;
        }
    };
    let base = match listener.local_addr() {
        Ok(addr) => format!("http://{addr}"),
        Err(e) => {
            eprintln!("no local address: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("serving on {base}: /flaky and /slow behind a breaker (3 failures, 1 s wait) and a {} ms timeout", ROUTE_TIMEOUT.as_millis());

    let client_registry = registry.clone();
    match tokio::task::spawn_blocking(move || client(&base, &client_registry)).await {
        Ok(Ok(checks)) if checks.0.is_empty() => {
            println!("ok: the breaker opened, answered 503 with Retry-After, and closed again; the slow handler answered 504");
            ExitCode::SUCCESS
        }
        Ok(Ok(checks)) => {
            eprintln!(
                "{} unexpected result(s): {}",
                checks.0.len(),
                checks.0.join("; ")
            );
            ExitCode::FAILURE
        }
        Ok(Err(e)) => {
            eprintln!("request failed: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("client task failed: {e}");
            ExitCode::FAILURE
        }
    }
}
