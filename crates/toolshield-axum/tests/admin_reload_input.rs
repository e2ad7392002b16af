//! What an operator (or anyone who got hold of the admin port) can send to
//! `POST /admin/reload`, through a real server and a real HTTP client, with a real
//! `Shield` behind the callback as docs/reload.md shows it: bodies that are not UTF-8,
//! nested past any parser's depth, thousands of tools, durations at zero, at the maximum
//! and past it, tool names with `__`, control characters or of any length. Each is
//! answered by a JSON 4xx naming the problem (never a 500, a dropped connection or a
//! crash), the running configuration and generation stay, an answer does not grow with
//! what it quotes, and nothing is even read without the token. Reloading many distinct
//! tool names does not grow `/metrics` while none of them is called.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_axum::{ReloadSource, ShieldRouter};
use toolshield_core::{CallKind, ConfigError, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, ServiceExt};

use support::serve;

const TOKEN: &str = "reload-input-admin-token";

/// A response: status, content type, body (JSON when it parses, else the text), size.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: Value,
    len: usize,
}

async fn post(base: &str, token: Option<&str>, content_type: &str, body: Vec<u8>) -> Answer {
    let url = format!("{base}/admin/reload");
    let auth = token.map(|t| format!("Bearer {t}"));
    let content_type = content_type.to_owned();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let mut req = agent.post(&url).header("content-type", &content_type);
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        let mut resp = req
            .send(&body[..])
            .expect("an answer, not a dropped connection");
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = resp
            .body_mut()
            .with_config()
            .limit(8 << 20)
            .read_to_string()
            .expect("body");
        Answer {
            status: resp.status().as_u16(),
            content_type,
            len: text.len(),
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    })
    .await
    .expect("client")
}

async fn get_text(url: String) -> String {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let mut resp = agent.get(&url).call().expect("answer");
        resp.body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .expect("body")
    })
    .await
    .expect("client")
}

/// The callback of docs/reload.md: parse, reload, answer the summary.
fn apply(
    shield: Shield,
    calls: Arc<AtomicUsize>,
) -> impl Fn(ReloadSource) -> Result<Value, ConfigError> {
    move |source| {
        calls.fetch_add(1, Ordering::SeqCst);
        let config = match source {
            ReloadSource::Toml(text) => ShieldConfig::from_toml_str(&text)?,
            ReloadSource::Json(text) => ShieldConfig::from_json_str(&text)?,
            _ => return Err(ConfigError::single("", "no file in this server")),
        };
        let summary = shield.reload(config)?;
        serde_json::to_value(summary).map_err(|e| ConfigError::single("", e))
    }
}

const START: &str = "[tools.search]\nkind = \"read_only\"\nretry = { max_attempts = 2 }\n";

struct Server {
    shield: Shield,
    base: String,
    callbacks: Arc<AtomicUsize>,
}

async fn server() -> Server {
    let exporter = toolshield::metrics::local_prometheus();
    let shield = Shield::from_config(ShieldConfig::from_toml_str(START).expect("config"))
        .and_then(|s| s.with_metrics(&exporter))
        .expect("shield");
    let callbacks = Arc::new(AtomicUsize::new(0));
    let ops = ShieldRouter::new()
        .metrics(exporter)
        .breakers(shield.breakers())
        .admin_token(TOKEN)
        .reload_with(apply(shield.clone(), Arc::clone(&callbacks)))
        .build();
    let base = format!("http://{}", serve(ops).await);
    Server {
        shield,
        base,
        callbacks,
    }
}

/// A 4xx with a JSON `{"error": ...}` body, and the running configuration untouched.
fn assert_refused(a: &Answer, status: u16, what: &str, server: &Server, generation: u64) {
    assert_eq!(a.status, status, "{what}: {a:?}");
    assert_eq!(a.content_type, "application/json", "{what}: {a:?}");
    assert!(
        a.body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{what}: {a:?}"
    );
    assert_eq!(server.shield.generation(), generation, "{what}");
    assert_eq!(
        server.shield.config().tools["search"].retry.max_attempts,
        2,
        "{what}: the running configuration stays"
    );
}

/// The `field`s of a 422's problems.
fn fields(a: &Answer) -> Vec<String> {
    a.body["problems"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| p["field"].as_str().unwrap_or("?").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_no_parser_can_take_are_json_4xx_and_the_server_keeps_serving() {
    let s = server().await;
    let g = s.shield.generation();

    let mut not_utf8 = START.as_bytes().to_vec();
    not_utf8.extend_from_slice(&[0xff, 0xfe, b'\n']);
    let a = post(&s.base, Some(TOKEN), "application/toml", not_utf8).await;
    assert_refused(&a, 400, "a body that is not UTF-8", &s, g);

    // Nesting near the body limit: a parser without a depth limit would overflow the
    // stack and take the process down with it.
    let depth = 400_000;
    let cases = [
        (
            "application/toml",
            format!("x = {}{}", "[".repeat(depth), "]".repeat(depth)),
        ),
        (
            "application/toml",
            format!(
                "x = {}{}",
                "{ a = ".repeat(depth / 6),
                "}".repeat(depth / 6)
            ),
        ),
        (
            "application/json",
            format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
        ),
        (
            "application/json",
            format!("{}{}", "{\"a\":".repeat(depth / 5), "}".repeat(depth / 5)),
        ),
        (
            "application/json",
            format!(
                "{{\"tools\":{{\"t\":{{\"kind\":\"read_only\",\"schema\":{}1{}}}}}}}",
                "{\"not\":".repeat(depth / 8),
                "}".repeat(depth / 8)
            ),
        ),
    ];
    for (content_type, body) in cases {
        assert!(body.len() < toolshield_axum::MAX_RELOAD_BODY);
        let what = format!(
            "{content_type} nested {} bytes: {}",
            body.len(),
            &body[..20]
        );
        let a = post(&s.base, Some(TOKEN), content_type, body.into_bytes()).await;
        assert_refused(&a, 422, &what, &s, g);
        assert!(!fields(&a).is_empty(), "{what}: {a:?}");
    }

    // Still serving: a good reload applies.
    let a = post(
        &s.base,
        Some(TOKEN),
        "application/toml",
        format!("{START}\n[tools.mail]\nkind = \"mutating\"\n").into_bytes(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body["summary"]["added"], json!(["mail"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_tools_are_refused_as_a_whole_with_the_bound_named() {
    let s = server().await;
    let g = s.shield.generation();
    let many: String = (0..5000)
        .map(|i| format!("[tools.t{i}]\nkind = \"read_only\"\n"))
        .collect();
    let a = post(
        &s.base,
        Some(TOKEN),
        "application/toml",
        format!("{START}{many}").into_bytes(),
    )
    .await;
    assert_refused(&a, 422, "5000 tools", &s, g);
    assert!(
        a.len < 64 << 10,
        "one problem for the bound, not one per tool: {} bytes",
        a.len
    );

    // Five thousand tools, each with a problem: every problem is listed, and the answer
    // stays in proportion to the body.
    let bad: String = (0..5000)
        .map(|i| format!("[tools.t{i}]\nretry = {{ max_attempts = 0 }}\n"))
        .collect();
    let body_len = bad.len() + START.len();
    let a = post(
        &s.base,
        Some(TOKEN),
        "application/toml",
        format!("{START}{bad}").into_bytes(),
    )
    .await;
    assert_refused(&a, 422, "5000 bad tools", &s, g);
    assert!(
        a.len < 8 * body_len,
        "{} bytes answered to {body_len}",
        a.len
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_at_zero_or_past_the_maximum_are_refused_and_the_maximum_works() {
    let s = server().await;
    let g = s.shield.generation();
    for (what, timeout) in [
        ("zero", "attempt = \"0s\""),
        ("past 366 days", "attempt = \"367days\""),
        ("past u64 seconds", "attempt = \"18446744073709551616s\""),
        (
            "an overflowing sum",
            "attempt = \"18446744073709551615s 18446744073709551615s\"",
        ),
        (
            "nanoseconds past u64",
            "attempt = \"99999999999999999999999ns\"",
        ),
        ("a negative one", "attempt = \"-1s\""),
        ("a bare number", "attempt = 30"),
        ("a huge total", "total = \"5000000000000000h\""),
    ] {
        let body = format!("[tools.search]\nkind = \"read_only\"\ntimeout = {{ {timeout} }}\n");
        let a = post(&s.base, Some(TOKEN), "application/toml", body.into_bytes()).await;
        assert_refused(&a, 422, what, &s, g);
        assert!(
            fields(&a)
                .iter()
                .any(|f| f.starts_with("tools.search.timeout")),
            "{what}: {a:?}"
        );
    }

    // The longest accepted: every layer's deadline arithmetic must hold at it.
    let longest = "366days";
    let body = format!(
        "[tools.search]\nkind = \"read_only\"\nretry = {{ max_attempts = 2 }}\n\
         timeout = {{ attempt = \"{longest}\", total = \"{longest}\" }}\n\
         cache = {{ ttl = \"{longest}\" }}\n\
         breaker = {{ open_wait = \"{longest}\", max_open_wait = \"{longest}\", idle_ttl = \"{longest}\" }}\n"
    );
    let a = post(&s.base, Some(TOKEN), "application/toml", body.into_bytes()).await;
    assert_eq!(a.status, 200, "{a:?}");
    let tool = s.shield.wrap(
        "search",
        service_fn(|_req: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!({ "ok": true })))
        }),
    );
    let ok = tool
        .oneshot(ToolRequest::new("search", json!({})).kind(CallKind::ReadOnly))
        .await
        .expect("a call under the longest durations");
    assert_eq!(ok.output["ok"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_names_are_checked_and_a_refusal_does_not_echo_a_long_name_whole() {
    let s = server().await;
    let g = s.shield.generation();
    let long = "n".repeat(600_000);
    for (what, name) in [
        ("a control character", "\"bell\\u0007\"".to_owned()),
        ("a newline", "\"a\\nb\"".to_owned()),
        ("a brace", "\"a{b}\"".to_owned()),
        ("empty", "\"\"".to_owned()),
        ("blank", "\"  \"".to_owned()),
        ("surrounding whitespace", "\" search\"".to_owned()),
        ("reserved other", "other".to_owned()),
        ("reserved defaults", "defaults".to_owned()),
        ("257 bytes", "n".repeat(257)),
        ("600 KB", long.clone()),
    ] {
        let body = format!("{START}[tools.{name}]\nkind = \"read_only\"\n");
        let a = post(&s.base, Some(TOKEN), "application/toml", body.into_bytes()).await;
        assert_refused(&a, 422, what, &s, g);
        assert!(
            fields(&a).iter().any(|f| f.starts_with("tools")),
            "{what}: {a:?}"
        );
        assert!(
            a.len < 4096,
            "{what}: an answer of {} bytes for one bad name",
            a.len
        );
    }

    // A name with `__` is a valid tool name (only environment overrides cannot reach it).
    let body = format!("{START}[tools.mcp__search]\nkind = \"read_only\"\n");
    let a = post(&s.base, Some(TOKEN), "application/toml", body.into_bytes()).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body["summary"]["added"], json!(["mcp__search"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_a_hostile_body_is_never_read() {
    let s = server().await;
    let g = s.shield.generation();
    // Deep enough to overflow a recursive parser's stack, small enough (80 KB) to sit in
    // the socket's buffer whole: a server that answers 401 without reading it must not
    // break the client's write of it (a broken pipe would say nothing about the server).
    let nested = format!("x = {}{}", "[".repeat(40_000), "]".repeat(40_000));
    for token in [None, Some("wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
        let a = post(
            &s.base,
            token,
            "application/toml",
            nested.clone().into_bytes(),
        )
        .await;
        assert_refused(&a, 401, &format!("token {token:?}"), &s, g);
    }
    assert_eq!(s.callbacks.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_many_distinct_tool_names_adds_no_series_while_none_is_called() {
    let s = server().await;
    let tool = s.shield.wrap(
        "search",
        service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!({}))) }),
    );
    tool.clone()
        .oneshot(ToolRequest::new("search", json!({})).kind(CallKind::ReadOnly))
        .await
        .expect("call");
    let before = get_text(format!("{}/metrics", s.base)).await;

    for round in 0..20 {
        let names: String = (0..200)
            .map(|i| {
                format!(
                    "[tools.r{round}_{i}]\nkind = \"read_only\"\nbreaker = {{ consecutive_failures = {} }}\n",
                    i + 1
                )
            })
            .collect();
        let a = post(
            &s.base,
            Some(TOKEN),
            "application/toml",
            format!("{START}{names}").into_bytes(),
        )
        .await;
        assert_eq!(a.status, 200, "round {round}: {a:?}");
    }
    // Back to the first configuration: the 4000 names configured meanwhile are gone.
    let a = post(
        &s.base,
        Some(TOKEN),
        "application/toml",
        START.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    tool.oneshot(ToolRequest::new("search", json!({})).kind(CallKind::ReadOnly))
        .await
        .expect("call");

    let after = get_text(format!("{}/metrics", s.base)).await;
    assert!(
        !after.contains("r0_") && !after.contains("r19_"),
        "a name never called has no series"
    );
    let series = |text: &str| text.lines().filter(|l| !l.starts_with('#')).count();
    assert!(
        series(&after) <= series(&before) + 8,
        "{} series before, {} after",
        series(&before),
        series(&after)
    );
}
