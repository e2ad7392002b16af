//! `/healthz` through a real server and a real HTTP client: 200 when every core check
//! passes, 503 with valid JSON naming the failing component when one fails or times out.

mod support;

use std::time::Duration;

use toolshield_axum::{ComponentStatus, Importance, ShieldRouter};
use toolshield_breaker::BreakerRegistry;

use support::{request, serve};

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
    assert_eq!(
        body["components"]["breakers"]["open"],
        serde_json::json!(["weather"])
    );
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
