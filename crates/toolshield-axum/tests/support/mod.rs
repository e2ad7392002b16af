//! A real server on 127.0.0.1:0 and a real HTTP client (ureq, blocking, run off the
//! runtime).

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

/// Serves `router` on a free loopback port.
pub async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

/// A response: status, content type, body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
    pub www_authenticate: Option<String>,
    pub retry_after: Option<String>,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not valid JSON ({e}): {}", self.body))
    }
}

/// Sends one request.
pub async fn request(method: &'static str, url: String, token: Option<&str>) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let result = match (method, &auth) {
            ("GET", Some(a)) => agent.get(&url).header("authorization", a).call(),
            ("GET", None) => agent.get(&url).call(),
            ("POST", Some(a)) => agent.post(&url).header("authorization", a).send_empty(),
            (_, _) => agent.post(&url).send_empty(),
        };
        let mut resp = result.unwrap();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header("content-type").unwrap_or_default();
        let www_authenticate = header("www-authenticate");
        let retry_after = header("retry-after");
        Answer {
            status: resp.status().as_u16(),
            content_type,
            www_authenticate,
            retry_after,
            body: resp.body_mut().read_to_string().unwrap(),
        }
    })
    .await
    .unwrap()
}

/// `(key, state)` of every breaker an `/admin/breakers` answer lists, in its order.
pub fn breaker_states(body: &serde_json::Value) -> Vec<(String, String)> {
    body["breakers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let s = |f: &str| b[f].as_str().unwrap().to_owned();
            (s("key"), s("state"))
        })
        .collect()
}
