//! The 503 answers a client reads when something is down, through a real server on
//! 127.0.0.1:0 and a real HTTP client: an open breaker's `CIRCUIT_OPEN` answer and a
//! degraded `/healthz` are valid JSON (`content-type: application/json`) whatever the
//! tool, the check or its error text is called: quotes, backslashes, line feeds, NUL,
//! line separators, markup, text that looks like JSON, non-ASCII, a long name.

mod support;

use std::fmt::Write as _;

use axum::extract::Path;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use toolshield_axum::{error_response, ShieldRouter};
use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_core::{
    printable, ErrorKind, ToolError, ToolRequest, ToolResponse, MAX_TOOL_NAME_SHOWN,
};
use tower::{service_fn, Layer, ServiceExt};

use support::{request, serve};

/// Names and texts a careless JSON writer would break.
fn awkward_texts() -> Vec<String> {
    vec![
        "we\"ather".to_owned(),
        "back\\slash".to_owned(),
        "line\nfeed\r\n".to_owned(),
        "tab\tand\u{0}nul".to_owned(),
        "esc\u{1b}[31mred".to_owned(),
        "sep\u{2028}ara\u{2029}tors".to_owned(),
        "</script><script>alert(1)</script>".to_owned(),
        "{\"error\":{\"code\":\"OK\"}}".to_owned(),
        "ünïcødé-€-天気".to_owned(),
        "'single' `back` \u{7f}".to_owned(),
        "\"".repeat(300),
    ]
}

/// Every byte of `text` percent-encoded, so the path carries it exactly.
fn percent_encoded(text: &str) -> String {
    text.bytes().fold(String::new(), |mut out, b| {
        let _ = write!(out, "%{b:02X}");
        out
    })
}

/// `GET /tools/{name}`: calls the tool `name` through `svc`; an error is answered with
/// `error_response`.
fn tool_app(registry: &BreakerRegistry) -> Router {
    let svc = BreakerLayer::new(registry.clone()).layer(service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
    }));
    Router::new().route(
        "/tools/{name}",
        get(move |Path(name): Path<String>| {
            let svc = svc.clone();
            async move {
                match svc.oneshot(ToolRequest::new(name, json!({}))).await {
                    Ok(res) => Json(res.output).into_response(),
                    Err(e) => error_response(&e),
                }
            }
        }),
    )
}

fn open_after_one_failure() -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 1,
        ..BreakerConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breakers_503_is_valid_json_whatever_the_tool_is_named() {
    let registry = open_after_one_failure();
    let addr = serve(tool_app(&registry)).await;
    for name in awkward_texts() {
        let url = format!("http://{addr}/tools/{}", percent_encoded(&name));
        let failed = request("GET", url.clone(), None).await;
        assert_eq!(failed.status, 503, "{name:?}: {failed:?}");
        assert_eq!(failed.json()["error"]["code"], "UPSTREAM_UNAVAILABLE");
        assert_eq!(registry.state(&name), CircuitState::Open, "{name:?}");

        let a = request("GET", url, None).await;
        assert_eq!(a.status, 503, "{name:?}: {a:?}");
        assert_eq!(a.content_type, "application/json", "{name:?}");
        let retry_after: u64 = (a.retry_after.as_deref())
            .unwrap_or_else(|| panic!("{name:?}: no Retry-After"))
            .parse()
            .unwrap_or_else(|e| panic!("{name:?}: Retry-After not whole seconds: {e}"));
        assert!((1..=30).contains(&retry_after), "{name:?}: {retry_after}");
        let body = a.json();
        let fields: Vec<&String> = body["error"].as_object().unwrap().keys().collect();
        assert_eq!(fields, ["code", "message", "retriable"], "{name:?}: {body}");
        assert_eq!(body["error"]["code"], "CIRCUIT_OPEN", "{name:?}");
        assert_eq!(body["error"]["retriable"], false, "{name:?}");
        let shown = printable(&name, MAX_TOOL_NAME_SHOWN);
        assert_eq!(
            body["error"]["message"],
            format!("circuit open for `{shown}`"),
            "{name:?}: the name on one line, cut short"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_healthz_is_valid_json_whatever_the_checks_are_named_or_say() {
    let mut ops = ShieldRouter::new().core_check("db", || async { Ok::<_, String>(()) });
    let texts = awkward_texts();
    for (i, text) in texts.iter().enumerate() {
        let error = text.clone();
        let name = format!("core {i} {text}");
        ops = ops.core_check(name, move || {
            let error = error.clone();
            async move { Err::<(), _>(error) }
        });
        let error = text.clone();
        ops = ops.non_core_check(format!("probe {i} {text}"), move || {
            let error = error.clone();
            async move { Err::<(), _>(error) }
        });
    }
    let addr = serve(ops.build()).await;

    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.content_type, "application/json");
    let body = a.json();
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["components"]["db"]["status"], "ok");
    let mut failing: Vec<String> = (body["failing"].as_array().unwrap().iter())
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    failing.sort();
    let mut expected: Vec<String> = (texts.iter().enumerate())
        .map(|(i, t)| format!("core {i} {t}"))
        .collect();
    expected.sort();
    assert_eq!(
        failing, expected,
        "every failing core check, by its exact name"
    );
    for (i, text) in texts.iter().enumerate() {
        for (name, core) in [
            (format!("core {i} {text}"), true),
            (format!("probe {i} {text}"), false),
        ] {
            let c = &body["components"][&name];
            assert_eq!(c["status"], "error", "{name:?}: {body}");
            assert_eq!(c["core"], core, "{name:?}");
            assert_eq!(c["error"], text.as_str(), "{name:?}: {c}");
        }
    }
}
