//! `POST /admin/reload` through a real server and a real HTTP client: 401 without the
//! token, 200 with a summary for a TOML or JSON body or a reload of the file, 422 with
//! every problem (and the running configuration kept), 415 for another content type,
//! and not mounted without a token or a callback.

mod support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use toolshield::config::ShieldConfig;
use toolshield::shield::{Shield, ToolRouter};
use toolshield_axum::{ReloadSource, ShieldRouter};
use toolshield_core::{CallKind, ConfigError, ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, ServiceExt};

use support::serve;

const TOKEN: &str = "reload-admin-token";

fn flaky(attempts: u32) -> String {
    format!(
        "[tools.flaky]\nkind = \"read_only\"\nretry = {{ max_attempts = {attempts}, backoff = {{ strategy = \"none\" }} }}\n"
    )
}

/// A response to a request with a body.
struct Answer {
    status: u16,
    body: Value,
}

async fn post(url: String, token: Option<&str>, content_type: &str, body: &str) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let (content_type, body) = (content_type.to_owned(), body.to_owned());
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let mut req = agent.post(&url).header("content-type", &content_type);
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        let mut resp = req.send(body.as_str()).expect("request");
        let text = resp.body_mut().read_to_string().expect("body");
        Answer {
            status: resp.status().as_u16(),
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    })
    .await
    .expect("client")
}

/// The first attempt of every call (`{"i": id}`) fails with OVERLOADED, the second
/// succeeds: a call succeeds only when the retry settings allow two attempts.
fn tools(shield: &Shield) -> ToolRouter {
    let attempts: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    shield
        .router()
        .tool(
            "flaky",
            service_fn(move |req: ToolRequest| {
                let id = req.payload()["i"].as_u64().unwrap_or(u64::MAX);
                let first = {
                    let mut map = attempts.lock().expect("attempts");
                    let n = map.entry(id).or_insert(0);
                    *n += 1;
                    *n == 1
                };
                async move {
                    if first {
                        Err(ToolError::new(ErrorKind::Overloaded, "busy"))
                    } else {
                        Ok(ToolResponse::new(json!({})))
                    }
                }
            }),
        )
        .build()
        .expect("router")
}

async fn call_succeeds(router: &ToolRouter) -> bool {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let i = NEXT.fetch_add(1, Ordering::SeqCst);
    let req = ToolRequest::new("flaky", json!({ "i": i })).kind(CallKind::ReadOnly);
    router.clone().oneshot(req).await.is_ok()
}

/// A configuration file of its own for each test.
fn config_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "toolshield-reload-{}-{name}.toml",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("write config");
    path
}

/// What an application passes to `reload_with`: parse, reload, answer the summary.
fn apply(shield: Shield, file: PathBuf) -> impl Fn(ReloadSource) -> Result<Value, ConfigError> {
    move |source| {
        let config = match source {
            ReloadSource::Toml(text) => ShieldConfig::from_toml_str(&text)?,
            ReloadSource::Json(text) => ShieldConfig::from_json_str(&text)?,
            _ => ShieldConfig::load(&file)?,
        };
        let summary = shield.reload(config)?;
        serde_json::to_value(summary).map_err(|e| ConfigError::single("", e))
    }
}

async fn server(name: &str) -> (Shield, ToolRouter, String, PathBuf) {
    let shield = Shield::from_config(ShieldConfig::from_toml_str(&flaky(1)).expect("config"))
        .expect("shield");
    let file = config_file(name, &flaky(1));
    let ops = ShieldRouter::new()
        .breakers(shield.breakers())
        .admin_token(TOKEN)
        .reload_with(apply(shield.clone(), file.clone()))
        .build();
    let base = format!("http://{}", serve(ops).await);
    (shield.clone(), tools(&shield), base, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_without_the_token_is_401_and_changes_nothing() {
    let (shield, router, base, file) = server("token").await;
    for token in [None, Some("wrong"), Some("reload-admin-toke")] {
        let a = post(
            format!("{base}/admin/reload"),
            token,
            "application/toml",
            &flaky(2),
        )
        .await;
        assert_eq!(a.status, 401, "{token:?}");
        assert!(a.body["error"].is_string());
    }
    assert_eq!(shield.generation(), 1);
    assert!(!call_succeeds(&router).await, "still one attempt");
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toml_or_json_body_is_applied_and_answered_with_a_summary() {
    let (shield, router, base, file) = server("body").await;
    assert!(!call_succeeds(&router).await);

    let a = post(
        format!("{base}/admin/reload"),
        Some(TOKEN),
        "application/toml",
        &flaky(2),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.body["reloaded"], true);
    assert_eq!(a.body["summary"]["generation"], 2);
    assert_eq!(a.body["summary"]["changed"], json!(["flaky"]));
    assert!(call_succeeds(&router).await, "two attempts now");

    let json_config = json!({
        "tools": { "flaky": { "kind": "read_only", "retry": { "max_attempts": 1 } } },
        "defaults": {}
    });
    let a = post(
        format!("{base}/admin/reload"),
        Some(TOKEN),
        "application/json; charset=utf-8",
        &json_config.to_string(),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.body["summary"]["generation"], 3);
    assert_eq!(shield.config().tools["flaky"].retry.max_attempts, 1);
    assert!(!call_succeeds(&router).await, "one attempt again");
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_configuration_is_422_with_every_problem_and_the_running_one_stays() {
    let (shield, router, base, file) = server("invalid").await;
    let bad = "[defaults]\nbreaker = { failure_rate = 250.0 }\n\
               [tools.flaky]\nretry = { max_attempts = 0 }\ntimeout = { attempt = \"0s\" }\n";
    let a = post(
        format!("{base}/admin/reload"),
        Some(TOKEN),
        "text/toml",
        bad,
    )
    .await;
    assert_eq!(a.status, 422, "{:?}", a.body);
    let fields: Vec<&str> = a.body["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .map(|p| p["field"].as_str().expect("field"))
        .collect();
    for want in [
        "defaults.breaker.failure_rate",
        "tools.flaky.retry.max_attempts",
        "tools.flaky.timeout.attempt",
    ] {
        assert!(fields.contains(&want), "{want} in {fields:?}");
    }
    let a = post(
        format!("{base}/admin/reload"),
        Some(TOKEN),
        "application/toml",
        "[tools",
    )
    .await;
    assert_eq!(
        a.status, 422,
        "a syntax error is a problem too: {:?}",
        a.body
    );
    let a = post(
        format!("{base}/admin/reload"),
        Some(TOKEN),
        "text/plain",
        &flaky(2),
    )
    .await;
    assert_eq!(a.status, 415);
    assert_eq!(shield.generation(), 1);
    assert!(
        !call_succeeds(&router).await,
        "the running configuration stays"
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_body_reloads_the_file() {
    let (shield, router, base, file) = server("file").await;
    std::fs::write(&file, flaky(2)).expect("write");
    let a = post(
        format!("{base}/admin/reload"),
        Some(TOKEN),
        "application/toml",
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(shield.config().tools["flaky"].retry.max_attempts, 2);
    assert!(call_succeeds(&router).await);

    std::fs::write(&file, "[tools.flaky]\nretry = { max_attempts = -1 }\n").expect("write");
    let a = post(format!("{base}/admin/reload"), Some(TOKEN), "", "").await;
    assert_eq!(a.status, 422, "{:?}", a.body);
    assert_eq!(shield.generation(), 2);
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_or_a_callback_there_is_no_reload_endpoint() {
    let shield = Shield::from_config(ShieldConfig::default()).expect("shield");
    let no_token = ShieldRouter::new()
        .reload_with(apply(shield.clone(), PathBuf::from("unused.toml")))
        .build();
    let base = format!("http://{}", serve(no_token).await);
    let a = post(
        format!("{base}/admin/reload"),
        Some(TOKEN),
        "application/toml",
        "",
    )
    .await;
    assert_eq!(a.status, 404);

    let no_callback = ShieldRouter::new()
        .breakers(shield.breakers())
        .admin_token(TOKEN)
        .build();
    let base = format!("http://{}", serve(no_callback).await);
    let a = post(
        format!("{base}/admin/reload"),
        Some(TOKEN),
        "application/toml",
        "",
    )
    .await;
    assert_eq!(a.status, 404);
    assert_eq!(shield.generation(), 1);
}
