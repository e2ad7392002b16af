//! `McpClientService` against a real in-process rmcp server, through the toolshield stack.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use toolshield::breaker::CircuitState;
use toolshield::prelude::*;
use toolshield::shield::Shield;
use toolshield_mcp::IsErrorPolicy;
use tower::ServiceExt;

fn shield(toml: &str) -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(toml).expect("valid config"))
        .expect("valid shield")
}

/// MCP tools here read only: the idempotency layer stays out of the way.
fn read(tool: &str, payload: serde_json::Value) -> ToolRequest {
    ToolRequest::new(tool, payload).kind(CallKind::ReadOnly)
}

const FAST: &str = r#"
[defaults]
kind = "read_only"
timeout = { attempt = "2s", soft = "1s" }
retry = { max_attempts = 3, backoff = { strategy = "exponential", base = "100ms", factor = 2.0, cap = "1s" } }
breaker = { consecutive_failures = 3, open_wait = "30s" }
"#;

#[tokio::test(start_paused = true)]
async fn flaky_tool_failing_twice_is_retried_to_success() {
    let (client, seen, _server) = common::start().await;
    // This server's `isError` results are transient: make them retriable.
    let client = client.is_error_policy(IsErrorPolicy::Error(ErrorKind::UpstreamUnavailable));
    let svc = shield(FAST).wrap("flaky", client);

    let res = svc
        .oneshot(read("flaky", json!({})))
        .await
        .expect("third attempt succeeds");

    assert_eq!(seen.flaky.load(Ordering::SeqCst), 3);
    assert_eq!(res.output["content"][0]["text"], "ok after 3");
    assert!(!res.is_error());
    assert_eq!(res.provenance.attempts, 3);
}

#[tokio::test(start_paused = true)]
async fn is_error_result_is_a_failure_counted_by_the_breaker() {
    let (client, seen, _server) = common::start().await;
    let shield = shield(FAST);
    let svc = shield.wrap("broken", client);

    for i in 1..=3u32 {
        let res = svc
            .clone()
            .oneshot(read("broken", json!({})))
            .await
            .expect("kept as a response");
        assert!(res.is_error(), "isError is kept in the output");
        assert_eq!(res.output["content"][0]["text"], "disk full");
        // EXECUTION_FAILED: counted, never retried.
        assert_eq!(seen.broken.load(Ordering::SeqCst), i);
        let status = shield
            .breaker_for("broken")
            .status("broken")
            .expect("breaker exists");
        assert_eq!(status.consecutive_failures.min(3), i.min(3));
    }
    assert_eq!(
        shield.breaker_for("broken").state("broken"),
        CircuitState::Open
    );
    let err = svc
        .oneshot(read("broken", json!({})))
        .await
        .expect_err("breaker open");
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(
        seen.broken.load(Ordering::SeqCst),
        3,
        "the open breaker kept the call away"
    );
}

#[tokio::test(start_paused = true)]
async fn hung_tool_hits_the_attempt_timeout() {
    let (client, seen, _server) = common::start().await;
    let svc = shield(
        r#"
[defaults]
kind = "read_only"
timeout = { attempt = "2s", soft = "1s" }
retry = { max_attempts = 1 }
"#,
    )
    .wrap("hang", client);

    let started = tokio::time::Instant::now();
    let err = svc
        .oneshot(read("hang", json!({})))
        .await
        .expect_err("times out");

    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(seen.hang.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn breaker_opens_on_a_dead_server() {
    let (client, seen, server) = common::start().await;
    let shield = shield(FAST);
    let svc = shield.wrap("echo", client);

    let ok = svc
        .clone()
        .oneshot(read("echo", json!({"a": 1})))
        .await
        .expect("server up");
    assert_eq!(ok.output["structuredContent"], json!({"a": 1}));

    server.abort();
    let _ = server.await;

    let err = svc
        .clone()
        .oneshot(read("echo", json!({"a": 2})))
        .await
        .expect_err("server dead");
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");
    // Three attempts (one call with retries) fail: the breaker opens.
    assert_eq!(shield.breaker_for("echo").state("echo"), CircuitState::Open);
    let err = svc
        .oneshot(read("echo", json!({"a": 3})))
        .await
        .expect_err("breaker open");
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(seen.echo.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn one_breaker_per_server_with_a_key_on_the_prefix() {
    use std::borrow::Cow;
    use toolshield::breaker::{key_fn, BreakerConfig, BreakerLayer, BreakerRegistry};
    use tower::Layer;

    let (client, _seen, server) = common::start().await;
    let registry = BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 2,
        ..BreakerConfig::default()
    })
    .expect("valid breaker config");
    let by_server = key_fn(|req: &ToolRequest| {
        Cow::Borrowed(req.tool().split_once("__").map_or(req.tool(), |(s, _)| s))
    });
    let svc = BreakerLayer::new(registry.clone())
        .key_fn(by_server)
        .layer(client.with_server("files"));

    server.abort();
    let _ = server.await;
    for tool in ["files__echo", "files__strict"] {
        let err = svc
            .clone()
            .oneshot(read(tool, json!({})))
            .await
            .expect_err("server dead");
        assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
    }
    assert_eq!(registry.state("files"), CircuitState::Open);
    // A sibling tool of the same server now fails fast.
    let err = svc
        .oneshot(read("files__flaky", json!({})))
        .await
        .expect_err("breaker open");
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
}
