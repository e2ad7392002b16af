//! A flaky axum server on 127.0.0.1:0 that records every request it receives.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

/// What the server saw: every request's path and arrival time.
#[derive(Default)]
pub struct Recorder {
    seen: Mutex<Vec<(String, Instant)>>,
    keys: Mutex<Vec<(String, Vec<String>)>>,
}

impl Recorder {
    /// The `Idempotency-Key` header values of each request to `path`, in order.
    pub fn keys(&self, path: &str) -> Vec<Vec<String>> {
        self.keys
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, k)| k.clone())
            .collect()
    }

    fn record(&self, path: &str) -> usize {
        let mut seen = self.seen.lock().unwrap();
        seen.push((path.to_owned(), Instant::now()));
        seen.iter().filter(|(p, _)| p == path).count()
    }

    /// How many requests reached `path`.
    pub fn count(&self, path: &str) -> usize {
        self.times(path).len()
    }

    /// When the requests to `path` arrived.
    pub fn times(&self, path: &str) -> Vec<Instant> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, t)| *t)
            .collect()
    }

    /// Requests per path.
    pub fn counts(&self) -> HashMap<String, usize> {
        let mut map = HashMap::new();
        for (p, _) in self.seen.lock().unwrap().iter() {
            *map.entry(p.clone()).or_insert(0) += 1;
        }
        map
    }
}

type Rec = State<Arc<Recorder>>;

async fn flaky(State(rec): Rec, uri: Uri) -> Response {
    // 503 once, then 200.
    if rec.record(uri.path()) == 1 {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        (StatusCode::OK, "recovered").into_response()
    }
}

async fn rate_limited(State(rec): Rec, uri: Uri) -> Response {
    if rec.record(uri.path()) == 1 {
        (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "2")],
            "slow down",
        )
            .into_response()
    } else {
        (StatusCode::OK, "allowed").into_response()
    }
}

async fn status_of(State(rec): Rec, uri: Uri) -> Response {
    rec.record(uri.path());
    match uri.path() {
        "/bad" => StatusCode::BAD_REQUEST.into_response(),
        "/missing" => StatusCode::NOT_FOUND.into_response(),
        "/fail" | "/post503" => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        _ => (StatusCode::OK, "ok").into_response(),
    }
}

async fn keyed(State(rec): Rec, uri: Uri, headers: axum::http::HeaderMap) -> Response {
    rec.record(uri.path());
    let keys = headers
        .get_all("idempotency-key")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    rec.keys.lock().unwrap().push((uri.path().to_owned(), keys));
    match uri.path() {
        "/keyed503" => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        "/keyed408" if rec.count(uri.path()) == 1 => {
            (StatusCode::REQUEST_TIMEOUT, [("retry-after", "0")]).into_response()
        }
        "/keyed425" => (StatusCode::TOO_EARLY, [("retry-after", "3")]).into_response(),
        _ => (StatusCode::OK, "ok").into_response(),
    }
}

async fn create(State(rec): Rec, uri: Uri, Json(body): Json<serde_json::Value>) -> Response {
    let n = rec.record(uri.path());
    tokio::time::sleep(Duration::from_millis(200)).await;
    (
        StatusCode::CREATED,
        Json(serde_json::json!({"order": n, "echo": body})),
    )
        .into_response()
}

/// Starts the server; returns its address and its recorder.
pub async fn start() -> (SocketAddr, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let app = Router::new()
        .route("/flaky", get(flaky))
        .route("/ratelimited", get(rate_limited))
        .route("/bad", get(status_of))
        .route("/missing", get(status_of))
        .route("/fail", get(status_of))
        .route("/ok", get(status_of))
        .route("/post503", post(status_of))
        .route("/create", post(create))
        .route("/keyed503", post(keyed))
        .route("/keyed200", post(keyed))
        .route("/keyed408", get(keyed).post(keyed))
        .route("/keyed425", get(keyed))
        .with_state(Arc::clone(&rec));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, rec)
}

/// A real hyper server that reads each request in full, counts it, then drops the
/// connection without answering: the request arrived, the answer never comes.
pub async fn start_dropping() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let ran = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = Arc::clone(&ran);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let counter = Arc::clone(&counter);
                    async move {
                        let _ = req.into_body().collect().await;
                        counter.fetch_add(1, Ordering::SeqCst);
                        // An error from the service makes hyper close the connection
                        // without writing a response.
                        Err::<hyper::Response<http_body_util::Full<bytes::Bytes>>, _>(
                            std::io::Error::other("handler dropped the connection"),
                        )
                    }
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, ran)
}

/// An address where nothing listens: bound, noted, closed.
pub fn refusing_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

/// A retry layer of `attempts` attempts without backoff or budget: a test's retries go
/// out at once, however many it makes.
pub fn retry_now(attempts: u32) -> toolshield_retry::RetryLayer {
    toolshield_retry::RetryLayer::from_config(&toolshield_retry::RetryConfig {
        max_attempts: attempts,
        backoff: toolshield_retry::BackoffStrategy::None,
        budget: toolshield_retry::BudgetConfig {
            enabled: false,
            ..toolshield_retry::BudgetConfig::default()
        },
        ..toolshield_retry::RetryConfig::default()
    })
    .unwrap()
}

/// The full stack with 3 attempts and no backoff by default.
pub fn shield() -> toolshield::shield::Shield {
    let cfg = toolshield::config::ShieldConfig::from_toml_str(
        r#"
        [defaults.retry]
        max_attempts = 3
        backoff = { strategy = "none" }
        "#,
    )
    .unwrap();
    toolshield::shield::Shield::from_config(cfg).unwrap()
}

/// A breaker registry that opens a key after `consecutive` failures in a row.
pub fn registry(consecutive: u32) -> toolshield_breaker::BreakerRegistry {
    toolshield_breaker::BreakerRegistry::new(toolshield_breaker::BreakerConfig {
        consecutive_failures: consecutive,
        ..toolshield_breaker::BreakerConfig::default()
    })
    .unwrap()
}
