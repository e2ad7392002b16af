//! `/healthz` through a real server and a real HTTP client: 200 when every core check
//! passes, 503 with valid JSON naming the failing component when one fails or times out.

mod support;

use std::time::Duration;

use std::borrow::Cow;
use toolshield_axum::{ComponentStatus, Importance, ShieldRouter};

use serde_json::json;
use toolshield_breaker::{key_fn, BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, Layer, ServiceExt};

use support::{breaker_states, request, serve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_is_200_json() {
    let router = ShieldRouter::new()
        .core_check("db", || async { Ok::<_, String>(()) })
        .core_check("redis", || async { Ok::<_, String>(()) })
        .build();
    let addr = serve(router).await;
    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.content_type, "application/json");
    let body = a.json();
    assert_eq!(body["status"], "ok");
    assert_eq!(body["components"]["db"]["status"], "ok");
    assert_eq!(body["components"]["db"]["core"], true);
    assert_eq!(body["components"]["redis"]["status"], "ok");
    assert_eq!(body["failing"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_core_check_is_503_naming_it() {
    let router = ShieldRouter::new()
        .core_check("db", || async { Err::<(), _>("connection refused") })
        .core_check("redis", || async { Ok::<_, String>(()) })
        .non_core_check("tool_probe", || async { Err::<(), _>("probe failed") })
        .build();
    let addr = serve(router).await;
    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.content_type, "application/json");
    let body = a.json();
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["failing"], serde_json::json!(["db"]));
    assert_eq!(body["components"]["db"]["status"], "error");
    assert_eq!(body["components"]["db"]["error"], "connection refused");
    assert_eq!(body["components"]["redis"]["status"], "ok");
    assert_eq!(body["components"]["tool_probe"]["status"], "error");
    assert_eq!(body["components"]["tool_probe"]["core"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_check_timing_out_is_503_and_checks_run_concurrently() {
    let router = ShieldRouter::new()
        .check(
            "redis",
            Importance::Core,
            Duration::from_millis(200),
            || async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<_, String>(())
            },
        )
        .check(
            "db",
            Importance::Core,
            Duration::from_millis(200),
            || async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<_, String>(())
            },
        )
        .build();
    let addr = serve(router).await;
    let started = std::time::Instant::now();
    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    // Two 200 ms timeouts run side by side, not one after the other (and never 30 s).
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(a.status, 503);
    let body = a.json();
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["failing"], serde_json::json!(["db", "redis"]));
    assert_eq!(body["components"]["redis"]["status"], "timeout");
    assert!(body["components"]["redis"]["error"]
        .as_str()
        .unwrap()
        .contains("200 ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_core_failures_and_open_breakers_do_not_fail_the_status() {
    let registry = BreakerRegistry::default();
    registry.force_open("weather");
    let router = ShieldRouter::new()
        .core_check("db", || async { Ok::<_, String>(()) })
        .non_core_check("tool_probe", || async { Err::<(), _>("tool down") })
        .breakers(registry)
        .build();
    let addr = serve(router).await;
    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 200);
    let body = a.json();
    assert_eq!(body["status"], "ok");
    assert_eq!(body["components"]["breakers"]["status"], "degraded");
    assert_eq!(body["components"]["breakers"]["open"], 0);
    assert_eq!(body["components"]["breakers"]["forced_open"], 1);
    assert_eq!(body["components"]["tool_probe"]["status"], "error");
    let _ = ComponentStatus::Ok;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_check_is_reported_not_fatal_to_the_server() {
    let router = ShieldRouter::new()
        .core_check("db", || async {
            if true {
                panic!("check bug");
            }
            Ok::<_, String>(())
        })
        .build();
    let addr = serve(router).await;
    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.json()["components"]["db"]["error"], "check panicked");
}

/// A failing call made by `caller`, through a breaker keyed per caller.
async fn failing_call(registry: &BreakerRegistry, caller: &str) {
    let svc = BreakerLayer::new(registry.clone())
        .key_fn(key_fn(|req: &ToolRequest| {
            Cow::Borrowed(req.meta().caller_id.as_deref().unwrap_or("anonymous"))
        }))
        .layer(service_fn(|_req: ToolRequest| async {
            Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
        }));
    let err = svc
        .oneshot(ToolRequest::new("weather", json!({})).caller(caller))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_counts_open_breakers_without_naming_their_keys() {
    let registry = BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 1,
        ..BreakerConfig::default()
    })
    .unwrap();
    // Keys are caller ids: e-mail addresses.
    failing_call(&registry, "alice@example.com").await;
    assert_eq!(registry.state("alice@example.com"), CircuitState::Open);
    registry.force_open("bob@example.com");
    registry.reset("carol@example.com");
    let router = ShieldRouter::new()
        .breakers(registry.clone())
        .admin_token("t0ken")
        .build();
    let addr = serve(router).await;

    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 200);
    for key in ["alice", "bob", "carol", "example.com"] {
        assert!(!a.body.contains(key), "`{key}` leaked in {}", a.body);
    }
    let breakers = &a.json()["components"]["breakers"];
    assert_eq!(breakers["status"], "degraded");
    assert_eq!(breakers["open"], 1, "{breakers}");
    assert_eq!(breakers["forced_open"], 1, "{breakers}");

    // The keys are on the admin API, behind its token.
    let a = request("GET", format!("http://{addr}/admin/breakers"), None).await;
    assert_eq!(a.status, 401);
    let a = request(
        "GET",
        format!("http://{addr}/admin/breakers"),
        Some("t0ken"),
    )
    .await;
    assert_eq!(a.status, 200);
    let listed = breaker_states(&a.json());
    assert_eq!(
        listed,
        [
            ("alice@example.com".to_owned(), "open".to_owned()),
            ("bob@example.com".to_owned(), "forced_open".to_owned()),
            ("carol@example.com".to_owned(), "closed".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_core_check_is_never_hidden_by_a_component_of_the_same_name() {
    // A check named like the built-in `breakers` component, and two checks sharing a name:
    // each failing core check must still fail `/healthz` and be listed.
    let registry = BreakerRegistry::default();
    let router = ShieldRouter::new()
        .core_check("breakers", || async { Err::<(), _>("breaker store down") })
        .core_check("redis", || async { Err::<(), _>("connection refused") })
        .core_check("redis", || async { Ok::<_, String>(()) })
        .breakers(registry)
        .build();
    let addr = serve(router).await;
    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 503, "{}", a.body);
    let body = a.json();
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["failing"], json!(["breakers", "redis"]), "{body}");
    let components = &body["components"];
    assert_eq!(components["breakers"]["error"], "breaker store down");
    assert_eq!(components["redis"]["error"], "connection refused");
    assert_eq!(components["redis#2"]["status"], "ok", "{body}");
    // The built-in breaker counts are still reported, under a name of their own.
    assert_eq!(components["breakers#2"]["open"], 0, "{body}");
    assert_eq!(components["breakers#2"]["core"], false, "{body}");
}
