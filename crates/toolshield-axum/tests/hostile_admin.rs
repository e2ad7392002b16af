//! The admin API and the public endpoints against hostile requests, through a real server
//! on 127.0.0.1:0 and a real HTTP client: paths an attacker chooses, methods, what an
//! unauthenticated request can read or change, and the validity of `/metrics`.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use toolshield_axum::ShieldRouter;
use toolshield_breaker::{BreakerRegistry, CircuitState};

use support::serve;

const TOKEN: &str = "hostile-admin-token";

#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: Value,
}

async fn send(
    method: &'static str,
    url: String,
    token: Option<&str>,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let content_type = content_type.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .allow_non_standard_methods(true)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into();
        let mut req = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        if let Some(c) = &content_type {
            req = req.header("content-type", c);
        }
        let req = req.body(body).expect("request");
        let mut resp = agent.run(req).expect("response");
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = resp
            .body_mut()
            .with_config()
            .limit(1 << 22)
            .read_to_string()
            .unwrap_or_default();
        Answer {
            status: resp.status().as_u16(),
            content_type,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    })
    .await
    .expect("client")
}

async fn admin_server(registry: &BreakerRegistry) -> String {
    let router = ShieldRouter::new()
        .breakers(registry.clone())
        .admin_token(TOKEN)
        .build();
    format!("http://{}", serve(router).await)
}

/// "Every admin refusal is a JSON `{"error": ...}` with a 4xx status, given only after the
/// token was checked" (`ShieldRouter` docs): a path with an empty action
/// (`/admin/breakers/weather/`) or a trailing slash after the action
/// (`/admin/breakers/weather/open/`) is a JSON 404 with the token, a 401 without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_paths_with_an_empty_last_segment_are_json_refusals_behind_the_token() {
    let registry = BreakerRegistry::default();
    registry.reset("weather");
    let base = admin_server(&registry).await;
    let mut wrong = Vec::new();
    for (method, path) in [
        ("POST", "/admin/breakers/weather/"),
        ("GET", "/admin/breakers/weather/"),
        ("POST", "/admin/breakers/weather/open/"),
        ("POST", "/admin/breakers//"),
    ] {
        let a = send(method, format!("{base}{path}"), Some(TOKEN), None, vec![]).await;
        let ok_with = (400..500).contains(&a.status)
            && a.content_type == "application/json"
            && a.body["error"].as_str().is_some_and(|e| !e.is_empty());
        let b = send(method, format!("{base}{path}"), None, None, vec![]).await;
        let ok_without = b.status == 401 && b.content_type == "application/json";
        if !ok_with || !ok_without {
            wrong.push(format!(
                "{method} {path}: with the token {} {:?} {}; without {} {:?}",
                a.status, a.content_type, a.body, b.status, b.content_type
            ));
        }
    }
    assert_eq!(registry.len(), 1, "nothing created");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A tool's name must not collide with the admin API's key for every breaker:
/// `POST /admin/breakers/all/open` acts on every breaker of every registry, so a tool
/// named `all` could never be acted on alone. The configuration and the router refuse
/// the name, and opening `all` opens every breaker, the configured tools' included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tool_can_be_named_after_the_admin_apis_every_breaker_key() {
    use toolshield::{Shield, ShieldConfig};
    use toolshield_core::{ToolError, ToolRequest, ToolResponse};
    use tower::{service_fn, ServiceExt};

    let err = ShieldConfig::from_toml_str("[tools.all]\nkind = \"read_only\"\n")
        .expect_err("`all` is reserved");
    assert!(err.to_string().contains("tools.all"), "{err}");

    let shield = Shield::from_config(
        ShieldConfig::from_toml_str("[tools.weather]\nkind = \"read_only\"\n").expect("config"),
    )
    .expect("shield");
    let echo =
        || service_fn(|_r: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!({}))) });
    let refused = shield.router().tool("all", echo()).build();
    assert!(refused.is_err(), "a route named `all` is refused");

    let svc = shield.wrap("weather", echo());
    svc.oneshot(ToolRequest::new("weather", json!({})))
        .await
        .expect("call");
    let router = ShieldRouter::new()
        .breakers(shield.breakers())
        .admin_token(TOKEN)
        .build();
    let base = format!("http://{}", serve(router).await);
    let a = send(
        "POST",
        format!("{base}/admin/breakers/all/open"),
        Some(TOKEN),
        None,
        vec![],
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        shield.breaker_for("weather").state("weather"),
        CircuitState::ForcedOpen,
        "{a:?}"
    );
}

/// The CLI in process: exit code, stdout, stderr; `Err` with the panic text if it panicked.
async fn cli(args: Vec<String>) -> Result<(i32, String, String), String> {
    let mut argv = vec!["toolshield".to_owned()];
    argv.extend(args);
    tokio::task::spawn_blocking(move || {
        std::panic::catch_unwind(move || {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = toolshield::cli::run_with(argv, &mut out, &mut err);
            (
                code,
                String::from_utf8_lossy(&out).into_owned(),
                String::from_utf8_lossy(&err).into_owned(),
            )
        })
        .map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default()
        })
    })
    .await
    .expect("blocking task")
}

/// "Bad arguments give a clear error and a non-zero exit, never a panic": `--timeout` is
/// any `u64`, and a huge one reaches the HTTP client's deadline arithmetic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_timeout_is_a_usage_error_or_works_never_a_panic() {
    let registry = BreakerRegistry::default();
    registry.reset("weather");
    let base = admin_server(&registry).await;
    for timeout in [
        u64::MAX.to_string(),
        (u64::MAX / 2).to_string(),
        "100000000000".to_owned(),
    ] {
        let got = cli(vec![
            "--timeout".into(),
            timeout.clone(),
            "--url".into(),
            base.clone(),
            "--token".into(),
            TOKEN.into(),
            "breakers".into(),
            "status".into(),
        ])
        .await;
        match got {
            Ok((code, _, err)) => assert!(
                code == 0 || code == toolshield::cli::EXIT_USAGE,
                "--timeout {timeout}: exit {code}: {err}"
            ),
            Err(panic) => panic!("--timeout {timeout}: the CLI panicked: {panic}"),
        }
    }
}

/// docs/operations.md: exit `2` for a usage error ("a URL that is not http(s)"), `3` only
/// when the server could not be reached. A URL that cannot be a URL at all (no host, a
/// port out of range, a space in the host) is the user's mistake, not an unreachable
/// server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_url_is_a_usage_error_not_an_unreachable_server() {
    let mut wrong = Vec::new();
    for url in [
        "http://",
        "http://127.0.0.1:99999",
        "http://exa mple.com",
        "http://[::1",
        "http://host:port",
    ] {
        let got = cli(vec![
            "--url".into(),
            url.into(),
            "--token".into(),
            "t".into(),
            "--timeout".into(),
            "1".into(),
            "breakers".into(),
            "status".into(),
        ])
        .await;
        match got {
            Ok((code, _, err)) if code != toolshield::cli::EXIT_USAGE => {
                wrong.push(format!("{url}: exit {code}: {}", err.trim()))
            }
            Ok(_) => {}
            Err(panic) => wrong.push(format!("{url}: panicked: {panic}")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Tool names a configuration accepts, with quotes, backslashes and non-ASCII text.
fn awkward_tool_names() -> Vec<String> {
    vec![
        "we\"ather".to_owned(),
        "back\\slash".to_owned(),
        "a\\\"b".to_owned(),
        "trailing\\".to_owned(),
        "ünïcødé-€-天気".to_owned(),
        "sp ace".to_owned(),
        "x".repeat(200),
    ]
}

/// `/metrics` stays valid text exposition (strictly parsed) with every flow-control
/// layer on (rate limit, bulkhead, hedging, fault injection, budgets, breakers in
/// registries named after the tools) for tools whose names hold quotes, backslashes and
/// non-ASCII text, and shows no caller id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_every_layer_stay_valid_exposition_with_awkward_tool_names() {
    use toolshield::metrics::local_prometheus;
    use toolshield::{Shield, ShieldConfig};
    use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
    use tower::{service_fn, ServiceExt};

    let names = awkward_tool_names();
    let mut tools = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        tools.insert(
            name.clone(),
            json!({
                "kind": "read_only",
                "cache": { "ttl": "1s" },
                "breaker": { "consecutive_failures": 3 + i },
                "rate_limit": { "rate": 1000, "period": "1s", "key": "caller" },
                "bulkhead": { "max_concurrent": 5, "key": "caller" },
                "hedge": { "enabled": true, "delay": "50ms" },
                "faults": { "enabled": true, "seed": 7, "latency": { "rate": 0.5, "delay": "1ms" } },
                "budget": { "max_calls": 100, "cost": 1 },
            }),
        );
    }
    let doc = json!({ "tools": tools, "runs": { "run_max_cost": 1000 } });
    let config = ShieldConfig::from_value(doc).expect("config");
    let exporter = local_prometheus();
    let shield = Shield::from_config(config)
        .expect("shield")
        .with_metrics(&exporter)
        .expect("metrics");
    for name in &names {
        let svc = shield.wrap(
            name,
            service_fn(|r: ToolRequest| async move {
                if r.payload()["fail"] == json!(true) {
                    Err(ToolError::new(
                        toolshield_core::ErrorKind::UpstreamUnavailable,
                        "down",
                    ))
                } else {
                    Ok::<_, ToolError>(ToolResponse::new(json!({})))
                }
            }),
        );
        for fail in [false, true] {
            let _ = svc
                .clone()
                .oneshot(
                    ToolRequest::new(name.as_str(), json!({ "fail": fail }))
                        .kind(CallKind::ReadOnly)
                        .caller("alice@example.com")
                        .run_id("run-of-alice"),
                )
                .await;
        }
    }
    let router = ShieldRouter::new()
        .metrics(exporter)
        .breakers(shield.breakers())
        .admin_token(TOKEN)
        .build();
    let base = format!("http://{}", serve(router).await);
    let a = send("GET", format!("{base}/metrics"), None, None, vec![]).await;
    assert_eq!(a.status, 200, "{a:?}");
    let text = a.body.as_str().expect("text").to_owned();
    if let Err(e) = toolshield_test::exposition::parse(&text) {
        panic!("invalid exposition: {e}\n{text}");
    }
    assert!(!text.contains("alice"), "a caller id on /metrics:\n{text}");
    // Every breaker of those registries is reachable through the admin API, by name.
    let a = send(
        "GET",
        format!("{base}/admin/breakers"),
        Some(TOKEN),
        None,
        vec![],
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
}
