//! Hostile input to the admin API through a real server and a real HTTP client: a key
//! that is not UTF-8 once decoded, keys with slashes and percent signs, paths with empty
//! segments, a body larger than the server takes, wrong methods and unknown routes, a
//! tool named after the every-breaker key. Every refusal is a 4xx with a JSON
//! `{"error": ...}` body (never a plain-text rejection, a 500 or a dropped connection),
//! and the token is checked before anything else is told. Also the CLI's `--timeout` and
//! `--url` at their extremes, and `/metrics` with every layer on for tools whose names
//! hold quotes, backslashes and non-ASCII text.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use toolshield_axum::ShieldRouter;
use toolshield_breaker::{BreakerRegistry, CircuitState};

use support::serve;

const TOKEN: &str = "hostile-admin-token";

/// A response: status, content type and body (JSON when it parses, else the text).
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
            .limit(1 << 20)
            .read_to_string()
            .expect("body");
        Answer {
            status: resp.status().as_u16(),
            content_type,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    })
    .await
    .expect("client")
}

/// Asserts a 4xx answered with a JSON `{"error": "..."}`.
fn assert_json_refusal(a: &Answer, status: u16, what: &str) {
    assert_eq!(a.status, status, "{what}: {a:?}");
    assert_eq!(a.content_type, "application/json", "{what}: {a:?}");
    assert!(
        a.body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{what}: {a:?}"
    );
}

async fn server(registry: &BreakerRegistry) -> String {
    let router = ShieldRouter::new()
        .breakers(registry.clone())
        .admin_token(TOKEN)
        .reload_with(|_source| Ok(json!({"changed": []})))
        .build();
    format!("http://{}", serve(router).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_utf8_is_a_json_400_for_every_admin_route() {
    let registry = BreakerRegistry::default();
    let base = server(&registry).await;
    for (method, path) in [
        ("GET", "/admin/breakers/%FF"),
        ("POST", "/admin/breakers/%FF/open"),
        ("POST", "/admin/breakers/%C3%28/reset?create=true"),
        ("POST", "/admin/breakers/weather/%FF"),
    ] {
        let a = send(method, format!("{base}{path}"), Some(TOKEN), None, vec![]).await;
        assert_json_refusal(&a, 400, path);
    }
    assert_eq!(registry.len(), 0, "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_slashes_and_percent_signs_are_addressed_percent_encoded() {
    let registry = BreakerRegistry::default();
    let base = server(&registry).await;
    for (encoded, key) in [
        ("server%2Ftool", "server/tool"),
        ("100%25", "100%"),
        ("a%20b%22c", "a b\"c"),
    ] {
        let a = send(
            "POST",
            format!("{base}/admin/breakers/{encoded}/open?create=true"),
            Some(TOKEN),
            None,
            vec![],
        )
        .await;
        assert_eq!(a.status, 200, "{encoded}: {a:?}");
        assert_eq!(a.body["key"], key, "{encoded}: {a:?}");
        assert_eq!(registry.state(key), CircuitState::ForcedOpen, "{encoded}");
        let a = send(
            "GET",
            format!("{base}/admin/breakers/{encoded}"),
            Some(TOKEN),
            None,
            vec![],
        )
        .await;
        assert_eq!(a.status, 200, "{encoded}: {a:?}");
        assert_eq!(a.body["breakers"][0]["key"], key, "{encoded}: {a:?}");
    }
    // An unencoded slash is another route: a JSON 404, nothing created.
    let a = send(
        "POST",
        format!("{base}/admin/breakers/server/tool/open?create=true"),
        Some(TOKEN),
        None,
        vec![],
    )
    .await;
    assert_json_refusal(&a, 404, "unencoded slash");
    assert_eq!(registry.len(), 3);
}

/// Sends a request with a large body over a raw connection: the server may answer (and
/// close) before the body is all sent, which an HTTP client reports as a broken pipe
/// rather than reading the answer. Writes what it can, then reads the answer.
async fn post_large(addr: std::net::SocketAddr, token: Option<&str>, body_len: usize) -> Answer {
    use std::io::{Read, Write};
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let raw = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let head = format!(
            "POST /admin/reload HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/toml\r\n{auth}content-length: {body_len}\r\nconnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).expect("head");
        let chunk = vec![b'#'; 64 << 10];
        let mut sent = 0;
        while sent < body_len {
            let n = chunk.len().min(body_len - sent);
            if stream.write_all(&chunk[..n]).is_err() {
                break;
            }
            sent += n;
        }
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        raw
    })
    .await
    .expect("client");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    Answer {
        status,
        content_type,
        body: serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_body_above_the_limit_is_a_json_413_and_the_callback_never_runs() {
    let called = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = called.clone();
    let router = ShieldRouter::new()
        .admin_token(TOKEN)
        .reload_with(move |_source| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(json!({}))
        })
        .build();
    let addr = serve(router).await;
    let a = post_large(addr, Some(TOKEN), 3 << 20).await;
    assert_json_refusal(&a, 413, "3 MiB body");
    let a = post_large(addr, Some(TOKEN), toolshield_axum::MAX_RELOAD_BODY + 1).await;
    assert_json_refusal(&a, 413, "one byte over the limit");
    // Without the token, the body is not even looked at.
    let a = post_large(addr, None, 3 << 20).await;
    assert_json_refusal(&a, 401, "3 MiB body without the token");
    assert!(!called.load(std::sync::atomic::Ordering::SeqCst));
    // A body within the limit reaches the callback.
    let a = post_large(addr, Some(TOKEN), 1000).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(called.load(std::sync::atomic::Ordering::SeqCst));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_checked_on_every_admin_route_and_method_before_anything_is_told() {
    let registry = BreakerRegistry::default();
    registry.force_open("weather");
    let base = server(&registry).await;
    for (method, path) in [
        ("GET", "/admin/breakers"),
        ("GET", "/admin/breakers/weather"),
        ("POST", "/admin/breakers/weather/open"),
        ("POST", "/admin/breakers/all/reset"),
        ("POST", "/admin/reload"),
        // Wrong methods on admin routes: 401 without the token, never a 405 that
        // tells which routes exist.
        ("GET", "/admin/breakers/weather/open"),
        ("DELETE", "/admin/breakers/weather"),
        ("GET", "/admin/reload"),
        ("PUT", "/admin/breakers"),
    ] {
        let a = send(method, format!("{base}{path}"), None, None, vec![]).await;
        assert_json_refusal(&a, 401, &format!("{method} {path}"));
        let a = send(method, format!("{base}{path}"), Some("wrong"), None, vec![]).await;
        assert_json_refusal(&a, 401, &format!("{method} {path} (wrong token)"));
    }
    assert_eq!(registry.state("weather"), CircuitState::ForcedOpen);
    // With the token, a wrong method is a JSON 405.
    for (method, path, status) in [
        ("GET", "/admin/breakers/weather/open", 405),
        ("DELETE", "/admin/breakers/weather", 405),
        ("GET", "/admin/reload", 405),
    ] {
        let a = send(method, format!("{base}{path}"), Some(TOKEN), None, vec![]).await;
        assert_json_refusal(&a, status, &format!("{method} {path}"));
    }
    assert_eq!(registry.state("weather"), CircuitState::ForcedOpen);
}

/// Sends `GET {url}` with `authorization: {header}` exactly as given.
async fn get_with_authorization(url: String, header: &'static str) -> Answer {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into();
        let mut resp = agent
            .get(&url)
            .header("authorization", header)
            .call()
            .expect("response");
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = resp.body_mut().read_to_string().expect("body");
        Answer {
            status: resp.status().as_u16(),
            content_type,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    })
    .await
    .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_matched_without_regard_to_case_and_nothing_else_passes() {
    let registry = BreakerRegistry::default();
    registry.force_open("weather");
    let base = server(&registry).await;
    let url = format!("{base}/admin/breakers");
    // RFC 7235 2.1: the scheme is case-insensitive; RFC 6750 2.1: `Bearer 1*SP token`.
    for ok in [
        "Bearer hostile-admin-token",
        "bearer hostile-admin-token",
        "BEARER hostile-admin-token",
        "BeArEr hostile-admin-token",
        "Bearer   hostile-admin-token",
    ] {
        let a = get_with_authorization(url.clone(), ok).await;
        assert_eq!(a.status, 200, "`{ok}`: {a:?}");
    }
    for refused in [
        "",
        "Bearer",
        "Bearer ",
        "Bearerhostile-admin-token",
        "Basic hostile-admin-token",
        "Token hostile-admin-token",
        "hostile-admin-token",
        "Bearer hostile-admin-token2",
        "Bearer hostile-admin-toke",
        "Bearer HOSTILE-ADMIN-TOKEN",
        "Bearer hostile-admin-token hostile-admin-token",
    ] {
        let a = get_with_authorization(url.clone(), refused).await;
        assert_json_refusal(&a, 401, &format!("`{refused}`"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_callback_that_panics_is_a_json_500_and_the_server_keeps_serving() {
    let registry = BreakerRegistry::default();
    let router = ShieldRouter::new()
        .breakers(registry.clone())
        .admin_token(TOKEN)
        .reload_with(|_source| panic!("secret-detail in a reload bug"))
        .build();
    let base = format!("http://{}", serve(router).await);
    let a = send(
        "POST",
        format!("{base}/admin/reload"),
        Some(TOKEN),
        Some("application/toml"),
        b"enabled = true".to_vec(),
    )
    .await;
    assert_json_refusal(&a, 500, "a panicking reload callback");
    assert!(
        !a.body.to_string().contains("secret-detail"),
        "the panic text is logged, never sent: {a:?}"
    );
    // The admin API still answers on a new connection.
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

/// A key longer than any call's breaker can have (`MAX_KEY_LEN`: a call with such a key
/// runs under the registry's overflow breaker) is refused with a JSON 400 when an action
/// asks to create it: an override on it would be reported as applied and never reach a
/// call, and the registry would keep the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_a_breaker_under_a_key_no_call_can_have_is_a_json_400() {
    let registry = BreakerRegistry::default();
    let base = server(&registry).await;
    let long = "k".repeat(toolshield_breaker::MAX_KEY_LEN + 1);
    let a = send(
        "POST",
        format!("{base}/admin/breakers/{long}/open?create=true"),
        Some(TOKEN),
        None,
        Vec::new(),
    )
    .await;
    assert_json_refusal(&a, 400, "overlong key");
    assert!(registry.status(&long).is_none(), "nothing was created");
    assert!(registry.status_all().is_empty());

    // A key of the largest length a call can have is created as before.
    let longest = "k".repeat(toolshield_breaker::MAX_KEY_LEN);
    let a = send(
        "POST",
        format!("{base}/admin/breakers/{longest}/open?create=true"),
        Some(TOKEN),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        registry.status(&longest).map(|s| s.state),
        Some(CircuitState::ForcedOpen)
    );
}

/// `?create=true` keeps the registry within `max_keys`: a breaker under an override is
/// never evicted, so a caller of the admin API creating one key per request would grow
/// the registry without end. A full registry evicts an idle breaker to make room; one
/// full of forced breakers refuses the key with a JSON 409 and keeps what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_created_through_the_admin_api_stay_within_max_keys() {
    let registry = BreakerRegistry::new(toolshield_breaker::BreakerConfig {
        max_keys: 2,
        ..Default::default()
    })
    .expect("config");
    let base = server(&registry).await;
    let post = |path: String| send("POST", format!("{base}{path}"), Some(TOKEN), None, vec![]);
    let create = |key: &str| post(format!("/admin/breakers/{key}/open?create=true"));
    for key in ["a", "b"] {
        let a = create(key).await;
        assert_eq!(a.status, 200, "{key}: {a:?}");
        assert_eq!(a.body["created"], true, "{key}: {a:?}");
    }
    for key in ["c", "d", "e"] {
        let a = create(key).await;
        assert_json_refusal(&a, 409, key);
        assert!(registry.status(key).is_none(), "{key} was not created");
    }
    assert_eq!(registry.len(), 2);
    assert_eq!(registry.state("a"), CircuitState::ForcedOpen);
    assert_eq!(registry.state("b"), CircuitState::ForcedOpen);

    // Reset lifts `a`'s override: an idle closed breaker, evicted to make room for `c`.
    let a = post("/admin/breakers/a/reset".to_owned()).await;
    assert_eq!(a.status, 200, "{a:?}");
    let a = create("c").await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(registry.state("c"), CircuitState::ForcedOpen);
    assert_eq!(registry.state("b"), CircuitState::ForcedOpen);
    assert_eq!(registry.len(), 2);

    // An action on a key the registry holds is never refused, full or not.
    let a = post("/admin/breakers/b/close".to_owned()).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(registry.state("b"), CircuitState::Disabled);
}

/// "Every admin refusal is a JSON `{"error": ...}` with a 4xx status, given only after the
/// token was checked" (`ShieldRouter` docs): a path with an empty action
/// (`/admin/breakers/weather/`) or a trailing slash after the action
/// (`/admin/breakers/weather/open/`) is a JSON 404 with the token, a 401 without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_paths_with_an_empty_last_segment_are_json_refusals_behind_the_token() {
    let registry = BreakerRegistry::default();
    registry.reset("weather");
    let base = server(&registry).await;
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
    let base = server(&registry).await;
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
