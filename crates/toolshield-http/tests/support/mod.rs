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
}

impl Recorder {
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
        .with_state(Arc::clone(&rec));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, rec)
}
