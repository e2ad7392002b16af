//! A flaky axum server on 127.0.0.1:0 that records every request it receives, and a
//! raw TCP server that reads a request and hangs up without answering.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::io::AsyncReadExt;

/// One request the server saw.
struct Seen {
    path: String,
    at: Instant,
    keys: Vec<String>,
    body: Vec<u8>,
}

/// What the server saw.
#[derive(Default)]
pub struct Recorder {
    seen: Mutex<Vec<Seen>>,
}

impl Recorder {
    /// Records a request; returns how many reached `path`, this one included.
    fn record(&self, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> usize {
        let keys = headers
            .get_all("idempotency-key")
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        let mut seen = self.seen.lock().unwrap();
        seen.push(Seen {
            path: uri.path().to_owned(),
            at: Instant::now(),
            keys,
            body: body.to_vec(),
        });
        seen.iter().filter(|s| s.path == uri.path()).count()
    }

    /// How many requests reached `path`.
    pub fn count(&self, path: &str) -> usize {
        self.times(path).len()
    }

    /// When the requests to `path` arrived.
    pub fn times(&self, path: &str) -> Vec<Instant> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path == path)
            .map(|s| s.at)
            .collect()
    }

    /// The bodies of the requests to `path`, in order.
    pub fn bodies(&self, path: &str) -> Vec<Vec<u8>> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path == path)
            .map(|s| s.body.clone())
            .collect()
    }

    /// The `Idempotency-Key` values of each request to `path`, in order.
    pub fn keys(&self, path: &str) -> Vec<Vec<String>> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path == path)
            .map(|s| s.keys.clone())
            .collect()
    }
}

/// An HTTP date `secs` seconds from now.
pub fn http_date_in(secs: u64) -> String {
    httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(secs))
}

async fn handle(
    State(rec): State<Arc<Recorder>>,
    uri: Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let n = rec.record(&uri, &headers, &body);
    match uri.path() {
        // 503, 503, then 200.
        "/flaky" if n <= 2 => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        "/flaky" => (StatusCode::OK, "recovered").into_response(),
        // 429 once, then 200.
        "/limited-delta" if n == 1 => {
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "2")]).into_response()
        }
        "/limited-date" if n == 1 => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", http_date_in(3))],
        )
            .into_response(),
        "/limited-delta" | "/limited-date" => (StatusCode::OK, "allowed").into_response(),
        // Always 429, asking for two minutes.
        "/limited-long-delta" => {
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "120")]).into_response()
        }
        "/limited-long-date" => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", http_date_in(120))],
        )
            .into_response(),
        "/fail" | "/post503" => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            (StatusCode::OK, "too late").into_response()
        }
        "/loop" => (StatusCode::FOUND, [("location", "/loop")]).into_response(),
        "/big" => (StatusCode::OK, vec![b'x'; 4096]).into_response(),
        // An error status whose body is larger than a small limit.
        "/big503" => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "7")],
            vec![b'x'; 4096],
        )
            .into_response(),
        "/big429" => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "9")],
            vec![b'x'; 4096],
        )
            .into_response(),
        _ => (StatusCode::OK, "ok").into_response(),
    }
}

/// Starts the server; returns its address and its recorder.
pub async fn start() -> (SocketAddr, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let app = Router::new().fallback(handle).with_state(Arc::clone(&rec));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, rec)
}

/// A server that reads what arrives on each connection, counts it, and closes the
/// connection without answering: the request arrived, the answer never comes.
pub async fn start_hanging_up() -> (SocketAddr, Arc<AtomicUsize>) {
    let received = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut request = Vec::new();
                // Read up to the end of the headers (the tests send small bodies
                // with them), then hang up.
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            });
        }
    });
    (addr, received)
}

/// An address where nothing listens: bound, noted, closed.
pub fn refusing_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}
