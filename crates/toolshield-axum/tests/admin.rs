//! The admin API and `/metrics` through a real server: 401 without or with a wrong
//! token, not mounted without a token, and every change visible in `/admin/breakers`,
//! in `/metrics`, in the breaker events and in the breaker's behaviour.

mod support;

use serde_json::json;
use toolshield::collectors::BreakerMetrics;
use toolshield_axum::ShieldRouter;
use toolshield_breaker::{BreakerLayer, BreakerRegistry, CircuitState, TransitionReason};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::local_prometheus;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

use support::{breaker_states, request, serve};

const TOKEN: &str = "s3cret-admin-token";

async fn call(registry: &BreakerRegistry, tool: &str) -> Result<ToolResponse, ToolError> {
    let mut svc = ServiceBuilder::new()
        .layer(BreakerLayer::new(registry.clone()))
        .service(service_fn(|_req: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!({"ok": true})))
        }));
    svc.ready()
        .await?
        .call(ToolRequest::new(tool.to_owned(), json!({})))
        .await
}

async fn server(registry: &BreakerRegistry, token: Option<&str>) -> String {
    let exporter = local_prometheus();
    exporter.add_collector(BreakerMetrics::new(registry.clone(), exporter.target()));
    let mut router = ShieldRouter::new()
        .metrics(exporter)
        .breakers(registry.clone());
    if let Some(t) = token {
        router = router.admin_token(t);
    }
    format!("http://{}", serve(router.build()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_admin_api_is_not_mounted() {
    let registry = BreakerRegistry::default();
    let base = server(&registry, None).await;
    let a = request("GET", format!("{base}/admin/breakers"), Some(TOKEN)).await;
    assert_eq!(a.status, 404);
    let a = request(
        "POST",
        format!("{base}/admin/breakers/weather/open"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 404);
    assert_eq!(registry.state("weather"), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_token_is_401() {
    let registry = BreakerRegistry::default();
    let base = server(&registry, Some(TOKEN)).await;
    for token in [
        None,
        Some("wrong"),
        Some("s3cret-admin-toke"),
        Some("s3cret-admin-tokenX"),
    ] {
        let a = request("GET", format!("{base}/admin/breakers"), token).await;
        assert_eq!(a.status, 401, "{token:?}");
        assert_eq!(a.content_type, "application/json");
        assert_eq!(a.www_authenticate.as_deref(), Some("Bearer"));
        assert!(a.json()["error"].is_string());
        let a = request("POST", format!("{base}/admin/breakers/weather/open"), token).await;
        assert_eq!(a.status, 401, "{token:?}");
    }
    assert_eq!(registry.state("weather"), CircuitState::Closed);
    let a = request("GET", format!("{base}/admin/breakers"), Some(TOKEN)).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json(), json!({"breakers": []}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_show_in_status_metrics_events_and_behaviour() {
    let registry = BreakerRegistry::default();
    let mut events = registry.subscribe();
    let base = server(&registry, Some(TOKEN)).await;
    call(&registry, "weather").await.unwrap();
    call(&registry, "search").await.unwrap();

    let a = request(
        "POST",
        format!("{base}/admin/breakers/weather/open"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let body = a.json();
    assert_eq!(body["action"], "open");
    assert_eq!(body["breakers"][0]["state"], "forced_open");

    // Event.
    let event = events.recv().await.unwrap();
    assert_eq!(
        (&*event.key, event.to, event.reason),
        (
            "weather",
            CircuitState::ForcedOpen,
            TransitionReason::ForcedOpen
        )
    );
    // Status.
    let list = request("GET", format!("{base}/admin/breakers"), Some(TOKEN))
        .await
        .json();
    let states = breaker_states(&list);
    assert_eq!(
        states,
        [
            ("search".into(), "closed".into()),
            ("weather".into(), "forced_open".into())
        ]
    );
    let one = request("GET", format!("{base}/admin/breakers/weather"), Some(TOKEN)).await;
    let one = one.json();
    assert_eq!(one["key"], "weather");
    assert_eq!(one["breakers"][0]["registry"], "default");
    assert_eq!(one["breakers"][0]["state"], "forced_open");
    let missing = request("GET", format!("{base}/admin/breakers/nope"), Some(TOKEN)).await;
    assert_eq!(missing.status, 404);
    // Behaviour.
    assert_eq!(
        call(&registry, "weather").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );
    call(&registry, "search").await.unwrap();
    // Metrics.
    let m = request("GET", format!("{base}/metrics"), None).await;
    assert_eq!(m.status, 200);
    assert!(
        m.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        m.content_type
    );
    for line in [
        r#"circuit_breaker_state{key="weather",state="forced_open"} 1"#,
        r#"circuit_breaker_state{key="weather",state="closed"} 0"#,
        r#"circuit_breaker_state{key="search",state="closed"} 1"#,
        r#"circuit_breaker_transitions_total{key="weather",from="closed",to="forced_open"} 1"#,
        r#"circuit_breaker_rejections_total{key="weather"} 1"#,
    ] {
        assert!(
            m.body.lines().any(|l| l == line),
            "missing `{line}` in\n{}",
            m.body
        );
    }

    // Reset: back to closed everywhere.
    let a = request(
        "POST",
        format!("{base}/admin/breakers/weather/reset"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(registry.state("weather"), CircuitState::Closed);
    call(&registry, "weather").await.unwrap();
    let m = request("GET", format!("{base}/metrics"), None).await;
    assert!(
        m.body
            .contains(r#"circuit_breaker_state{key="weather",state="closed"} 1"#),
        "{}",
        m.body
    );

    // `all`, metrics-only, close, and an unknown action.
    let a = request(
        "POST",
        format!("{base}/admin/breakers/all/metrics-only"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["breakers"].as_array().unwrap().len(), 2);
    assert_eq!(registry.state("search"), CircuitState::MetricsOnly);
    let a = request(
        "POST",
        format!("{base}/admin/breakers/search/close"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(registry.state("search"), CircuitState::Disabled);
    let a = request(
        "POST",
        format!("{base}/admin/breakers/all/open"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(registry.state("weather"), CircuitState::ForcedOpen);
    assert_eq!(registry.state("search"), CircuitState::ForcedOpen);
    let a = request(
        "POST",
        format!("{base}/admin/breakers/weather/explode"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 404);
    assert!(a.json()["error"]
        .as_str()
        .unwrap()
        .contains("unknown action"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_key_is_404_for_every_verb_and_nothing_is_created() {
    let registry = BreakerRegistry::default();
    registry.reset("weather");
    let base = server(&registry, Some(TOKEN)).await;

    let a = request("GET", format!("{base}/admin/breakers/wether"), Some(TOKEN)).await;
    assert_eq!(a.status, 404, "{}", a.body);
    for action in ["open", "close", "metrics-only", "reset"] {
        let a = request(
            "POST",
            format!("{base}/admin/breakers/wether/{action}"),
            Some(TOKEN),
        )
        .await;
        assert_eq!(a.status, 404, "{action}: {}", a.body);
        assert_eq!(a.content_type, "application/json");
        let error = a.json()["error"].as_str().unwrap().to_owned();
        assert!(error.contains("create=true"), "{error}");
    }
    // A malformed or misspelt query is refused, never taken as "create".
    for query in ["create=yes", "craete=true", "create"] {
        let a = request(
            "POST",
            format!("{base}/admin/breakers/wether/open?{query}"),
            Some(TOKEN),
        )
        .await;
        assert_eq!(a.status, 400, "{query}: {}", a.body);
    }
    assert!(registry.status("wether").is_none());
    assert_eq!(registry.len(), 1);
    assert_eq!(registry.state("weather"), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_true_pre_opens_a_key_not_seen_yet() {
    let registry = BreakerRegistry::default();
    let base = server(&registry, Some(TOKEN)).await;

    let a = request(
        "POST",
        format!("{base}/admin/breakers/payments/open?create=true"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let body = a.json();
    assert_eq!(body["created"], true);
    assert_eq!(body["breakers"][0]["key"], "payments");
    assert_eq!(body["breakers"][0]["state"], "forced_open");
    assert_eq!(registry.state("payments"), CircuitState::ForcedOpen);
    assert_eq!(
        call(&registry, "payments").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );

    // On a key that exists, `create=true` changes nothing but the action.
    let a = request(
        "POST",
        format!("{base}/admin/breakers/payments/reset?create=false"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["created"], false);
    let a = request(
        "POST",
        format!("{base}/admin/breakers/payments/close?create=true"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.json()["created"], false);
    assert_eq!(registry.state("payments"), CircuitState::Disabled);
    assert_eq!(registry.len(), 1);

    // `all` cannot be created.
    let a = request(
        "POST",
        format!("{base}/admin/breakers/all/open?create=true"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(registry.state("payments"), CircuitState::Disabled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_with_surrounding_whitespace_is_usable_and_a_blank_one_mounts_nothing() {
    // A token read from a file or a secret often ends with a newline; a header cannot
    // carry one, so kept as is it could never match and the admin API would be dead.
    let registry = BreakerRegistry::default();
    registry.force_open("weather");
    let router = ShieldRouter::new()
        .breakers(registry.clone())
        .admin_token("  s3cret-token\n")
        .build();
    let base = format!("http://{}", serve(router).await);
    let a = request(
        "GET",
        format!("{base}/admin/breakers"),
        Some("s3cret-token"),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = request("GET", format!("{base}/admin/breakers"), Some("wrong")).await;
    assert_eq!(a.status, 401);

    let router = ShieldRouter::new()
        .breakers(registry)
        .admin_token(" \n\t")
        .build();
    let base = format!("http://{}", serve(router).await);
    let a = request("GET", format!("{base}/admin/breakers"), Some("")).await;
    assert_eq!(a.status, 404, "a blank token mounts nothing: {}", a.body);
}
