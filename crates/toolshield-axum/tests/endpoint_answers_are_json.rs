//! What `/healthz` and the admin API answer, read through a real server and client:
//! HEAD, and admin paths a client may send by mistake. Every
//! error answer is valid JSON with `content-type: application/json`.

mod support;

use std::time::Duration;

use serde_json::Value;
use toolshield_axum::ShieldRouter;
use toolshield_breaker::BreakerRegistry;

use support::serve;

const TOKEN: &str = "s3cret-admin-token";

#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

async fn send(method: &'static str, url: String, token: Option<&'static str>) -> Answer {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .allow_non_standard_methods(true)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into();
        let mut req = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let mut resp = agent.run(req.body(Vec::<u8>::new()).unwrap()).unwrap();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = if method == "HEAD" {
            String::new()
        } else {
            resp.body_mut().read_to_string().unwrap()
        };
        Answer {
            status: resp.status().as_u16(),
            content_type,
            body,
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_on_healthz_has_the_status_and_content_type_of_get() {
    let ok = ShieldRouter::new()
        .core_check("db", || async { Ok::<_, String>(()) })
        .build();
    let down = ShieldRouter::new()
        .core_check("db", || async { Err::<(), _>("connection refused") })
        .build();
    for (router, status) in [(ok, 200), (down, 503)] {
        let base = format!("http://{}", serve(router).await);
        let get = send("GET", format!("{base}/healthz"), None).await;
        let head = send("HEAD", format!("{base}/healthz"), None).await;
        assert_eq!((get.status, head.status), (status, status));
        assert_eq!(get.content_type, "application/json");
        assert_eq!(head.content_type, "application/json");
        assert_eq!(
            get.json()["status"],
            if status == 200 { "ok" } else { "degraded" }
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_paths_sent_by_mistake_are_json_refusals() {
    let registry = BreakerRegistry::default();
    registry.reset("weather");
    let router = ShieldRouter::new()
        .breakers(registry.clone())
        .admin_token(TOKEN)
        .build();
    let base = format!("http://{}", serve(router).await);
    let huge = "k".repeat(10 * 1024);
    for (method, path, token) in [
        ("GET", "/admin/breakers/".to_owned(), Some(TOKEN)),
        ("POST", "/admin/breakers//open".to_owned(), Some(TOKEN)),
        ("GET", "/admin/breakers/%2E%2E".to_owned(), Some(TOKEN)),
        ("POST", "/admin/breakers/%2E/open".to_owned(), Some(TOKEN)),
        (
            "POST",
            "/admin/breakers/weather%2Fx/open".to_owned(),
            Some(TOKEN),
        ),
        ("GET", format!("/admin/breakers/{huge}"), Some(TOKEN)),
        ("POST", format!("/admin/breakers/{huge}/open"), Some(TOKEN)),
        (
            "POST",
            format!("/admin/breakers/{huge}/open?create=true"),
            Some(TOKEN),
        ),
        ("GET", "/admin/breakers/".to_owned(), None),
        ("GET", "/admin/breakers/weather".to_owned(), Some("wrong")),
        ("DELETE", "/admin/breakers/weather".to_owned(), None),
    ] {
        let a = send(method, format!("{base}{path}"), token).await;
        let what = format!("{method} {}", &path[..path.len().min(60)]);
        assert!((400..500).contains(&a.status), "{what}: {a:?}");
        assert_eq!(a.content_type, "application/json", "{what}: {a:?}");
        assert!(
            a.json()["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{what}"
        );
        if token != Some(TOKEN) {
            assert_eq!(a.status, 401, "{what}");
        }
        assert!(!a.body.contains(TOKEN));
    }
    assert_eq!(registry.len(), 1, "nothing created");
}

/// A breaker that tripped counts as `open`; once half-open (a probe is on its way) it
/// counts as neither `open` nor `forced_open`, and `/healthz` stays 200 throughout.
#[tokio::test(start_paused = true)]
async fn healthz_counts_a_tripped_breaker_as_open_and_a_half_open_one_as_neither() {
    use toolshield_breaker::{BreakerConfig, BreakerLayer, CircuitState};
    use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
    use tower::{service_fn, Layer, ServiceExt};

    let registry = BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(30),
        ..BreakerConfig::default()
    })
    .unwrap();
    let failing =
        BreakerLayer::new(registry.clone()).layer(service_fn(|_req: ToolRequest| async {
            Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
        }));
    let _ = failing
        .oneshot(ToolRequest::new("weather", serde_json::json!({})))
        .await;
    registry.reset("search");
    let base = format!(
        "http://{}",
        serve(ShieldRouter::new().breakers(registry.clone()).build()).await
    );
    let breakers = |a: &Answer| {
        let b = a.json()["components"]["breakers"].clone();
        (
            a.status,
            b["status"].as_str().map(str::to_owned),
            b["open"].as_u64(),
            b["forced_open"].as_u64(),
        )
    };
    assert_eq!(registry.state("weather"), CircuitState::Open);
    let a = send("GET", format!("{base}/healthz"), None).await;
    assert_eq!(
        breakers(&a),
        (200, Some("degraded".into()), Some(1), Some(0))
    );
    assert!(!a.body.contains("weather") && !a.body.contains("search"));

    // Past its wait, the breaker turns half-open when the next call comes: a probe that
    // has not answered yet.
    tokio::time::advance(Duration::from_secs(31)).await;
    let probe = BreakerLayer::new(registry.clone()).layer(service_fn(|_req: ToolRequest| async {
        std::future::pending::<Result<ToolResponse, ToolError>>().await
    }));
    let probe = tokio::spawn(probe.oneshot(ToolRequest::new("weather", serde_json::json!({}))));
    while registry.state("weather") != CircuitState::HalfOpen {
        tokio::task::yield_now().await;
    }
    let a = send("GET", format!("{base}/healthz"), None).await;
    assert_eq!(breakers(&a), (200, Some("ok".into()), Some(0), Some(0)));
    probe.abort();
}
