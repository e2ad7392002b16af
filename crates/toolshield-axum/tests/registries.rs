//! A shield with several breaker registries (the defaults, and a tool with breaker
//! settings of its own) behind one operations router: status, `all`, unknown keys,
//! `create=true` and `/healthz` see every registry.

mod support;

use serde_json::{json, Value};
use toolshield::{Shield, ShieldConfig};
use toolshield_axum::ShieldRouter;
use toolshield_breaker::CircuitState;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, ServiceExt};

use support::{request, serve};

const TOKEN: &str = "ops-token";

/// `search` is on the default breaker settings, `weather` has its own registry.
fn shield() -> Shield {
    let config = ShieldConfig::from_toml_str(
        r#"
        [tools.search]
        kind = "read_only"

        [tools.weather]
        kind = "read_only"

        [tools.weather.breaker]
        consecutive_failures = 3
        "#,
    )
    .unwrap();
    let shield = Shield::from_config(config).unwrap();
    assert_eq!(
        shield.breakers().keys().collect::<Vec<_>>(),
        ["default", "weather"],
        "the test needs two registries"
    );
    shield
}

async fn call(shield: &Shield, tool: &str) -> Result<ToolResponse, ToolError> {
    let svc = shield.wrap(
        tool,
        service_fn(|_req: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!({"ok": true})))
        }),
    );
    svc.oneshot(ToolRequest::new(tool.to_owned(), json!({})))
        .await
}

async fn server(shield: &Shield) -> String {
    let router = ShieldRouter::new()
        .breakers(shield.breakers())
        .admin_token(TOKEN)
        .build();
    format!("http://{}", serve(router).await)
}

/// `(registry, key, state)` of every breaker of an answer.
fn listed(body: &Value) -> Vec<(String, String, String)> {
    body["breakers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let s = |f: &str| b[f].as_str().unwrap().to_owned();
            (s("registry"), s("key"), s("state"))
        })
        .collect()
}

fn row(registry: &str, key: &str, state: &str) -> (String, String, String) {
    (registry.to_owned(), key.to_owned(), state.to_owned())
}

fn state(shield: &Shield, registry: &str, key: &str) -> Option<CircuitState> {
    shield.breakers()[registry].status(key).map(|s| s.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_all_cover_every_registry_for_every_verb() {
    let shield = shield();
    call(&shield, "search").await.unwrap();
    call(&shield, "weather").await.unwrap();
    let base = server(&shield).await;

    let a = request("GET", format!("{base}/admin/breakers"), Some(TOKEN)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        listed(&a.json()),
        [
            row("default", "search", "closed"),
            row("weather", "weather", "closed")
        ]
    );

    for (verb, expected) in [
        ("open", CircuitState::ForcedOpen),
        ("close", CircuitState::Disabled),
        ("metrics-only", CircuitState::MetricsOnly),
        ("reset", CircuitState::Closed),
        ("open", CircuitState::ForcedOpen),
    ] {
        let a = request(
            "POST",
            format!("{base}/admin/breakers/all/{verb}"),
            Some(TOKEN),
        )
        .await;
        assert_eq!(a.status, 200, "{verb}: {}", a.body);
        assert_eq!(a.json()["breakers"].as_array().unwrap().len(), 2, "{verb}");
        assert_eq!(
            state(&shield, "default", "search"),
            Some(expected),
            "{verb}"
        );
        assert_eq!(
            state(&shield, "weather", "weather"),
            Some(expected),
            "{verb}"
        );
    }
    // Forced open everywhere: both tools fail fast.
    for tool in ["search", "weather"] {
        assert_eq!(
            call(&shield, tool).await.unwrap_err().kind(),
            ErrorKind::CircuitOpen,
            "{tool}"
        );
    }
    let a = request(
        "POST",
        format!("{base}/admin/breakers/all/reset"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        listed(&a.json()),
        [
            row("default", "search", "closed"),
            row("weather", "weather", "closed")
        ]
    );
    call(&shield, "search").await.unwrap();
    call(&shield, "weather").await.unwrap();

    // `registry=` narrows `all` to one registry.
    let a = request(
        "POST",
        format!("{base}/admin/breakers/all/open?registry=weather"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        listed(&a.json()),
        [row("weather", "weather", "forced_open")]
    );
    assert_eq!(
        state(&shield, "default", "search"),
        Some(CircuitState::Closed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_key_is_404_in_every_registry_and_nothing_is_created() {
    let shield = shield();
    call(&shield, "search").await.unwrap();
    let base = server(&shield).await;
    let sizes = || {
        shield
            .breakers()
            .values()
            .map(|r| r.len())
            .collect::<Vec<_>>()
    };
    assert_eq!(sizes(), [1, 0]);

    // `weather` was never called: no registry holds it yet.
    for key in ["wether", "weather"] {
        let a = request("GET", format!("{base}/admin/breakers/{key}"), Some(TOKEN)).await;
        assert_eq!(a.status, 404, "{key}: {}", a.body);
        for verb in ["open", "close", "metrics-only", "reset"] {
            let a = request(
                "POST",
                format!("{base}/admin/breakers/{key}/{verb}"),
                Some(TOKEN),
            )
            .await;
            assert_eq!(a.status, 404, "{key} {verb}: {}", a.body);
        }
    }
    let a = request(
        "POST",
        format!("{base}/admin/breakers/search/open?registry=nope"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(a.status, 404, "{}", a.body);
    assert_eq!(sizes(), [1, 0]);
    assert_eq!(
        state(&shield, "default", "search"),
        Some(CircuitState::Closed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_true_creates_the_key_in_the_registry_of_its_tool_else_the_default() {
    let shield = shield();
    let base = server(&shield).await;
    let post = |path: &str| request("POST", format!("{base}{path}"), Some(TOKEN));

    // A tool with its own settings: its own registry, where its calls will look.
    let a = post("/admin/breakers/weather/open?create=true").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["created"], true);
    assert_eq!(
        listed(&a.json()),
        [row("weather", "weather", "forced_open")]
    );
    assert_eq!(state(&shield, "default", "weather"), None);
    assert_eq!(
        call(&shield, "weather").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );

    // A tool on the default settings, or any other key: the default registry.
    let a = post("/admin/breakers/search/open?create=true").await;
    assert_eq!(listed(&a.json()), [row("default", "search", "forced_open")]);
    assert_eq!(
        call(&shield, "search").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );
    let a = post("/admin/breakers/alice%40example.com/open?create=true").await;
    assert_eq!(
        listed(&a.json()),
        [row("default", "alice@example.com", "forced_open")]
    );

    // `registry=` picks the registry explicitly.
    let a = post("/admin/breakers/alice%40example.com/open?create=true&registry=weather").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["created"], true);
    assert_eq!(
        listed(&a.json()),
        [row("weather", "alice@example.com", "forced_open")]
    );
    let a = post("/admin/breakers/x/open?create=true&registry=nope").await;
    assert_eq!(a.status, 404, "{}", a.body);

    // A key held by both registries: an action without `registry=` reaches both.
    let a = post("/admin/breakers/alice%40example.com/reset").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["created"], false);
    assert_eq!(
        listed(&a.json()),
        [
            row("default", "alice@example.com", "closed"),
            row("weather", "alice@example.com", "closed")
        ]
    );
    let a = request(
        "GET",
        format!("{base}/admin/breakers/alice%40example.com?registry=weather"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        listed(&a.json()),
        [row("weather", "alice@example.com", "closed")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_counts_open_breakers_across_registries() {
    let shield = shield();
    shield.breakers()["default"].force_open("search");
    shield.breakers()["weather"].force_open("weather");
    shield.breakers()["weather"].force_open("bob@example.com");
    let router = ShieldRouter::new().breakers(shield.breakers()).build();
    let addr = serve(router).await;
    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 200);
    assert!(!a.body.contains("bob@example.com"), "{}", a.body);
    let breakers = &a.json()["components"]["breakers"];
    assert_eq!(breakers["status"], "degraded");
    assert_eq!(breakers["forced_open"], 3, "{breakers}");
    assert_eq!(breakers["open"], 0, "{breakers}");
}
