//! End-to-end tests of the default stack built from a `ShieldConfig`: one test per row of
//! the reliability test matrix and per finding of the audit the project started from.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use toolshield::config::ShieldConfig;
use toolshield::shield::{BoxTool, RouterBuilder, Shield};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolResult};
use tower::{service_fn, Service, ServiceExt};

/// A tool that counts its calls and behaves as `script(call number)` says.
fn scripted<F, Fut>(calls: &Arc<AtomicU32>, script: F) -> BoxTool
where
    F: Fn(u32, ToolRequest) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<ToolResponse, ToolError>> + Send + 'static,
{
    let calls = calls.clone();
    BoxTool::new(service_fn(move |req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        script(n, req)
    }))
}

fn counter() -> Arc<AtomicU32> {
    Arc::new(AtomicU32::new(0))
}

fn shield(toml: &str) -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(toml).expect("config")).expect("shield")
}

fn read(tool: &str, payload: Value) -> ToolRequest {
    ToolRequest::new(tool, payload).kind(CallKind::ReadOnly)
}

const NO_RETRY: &str = r#"
[defaults]
retry = { max_attempts = 1 }
breaker = { open_wait = "30s" }
"#;

// ---------------------------------------------------------------- test matrix

#[tokio::test(start_paused = true)]
async fn matrix_breaker_opens_after_5_consecutive_failures_and_fails_fast() {
    let calls = counter();
    let tool = scripted(&calls, |_, _| async {
        Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
    });
    let router = shield(NO_RETRY)
        .router()
        .tool("search", tool)
        .build()
        .expect("valid tool names");
    for _ in 0..5 {
        let e = router
            .clone()
            .oneshot(read("search", json!({})))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
    }
    let e = router
        .clone()
        .oneshot(read("search", json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CircuitOpen);
    assert!(e
        .retry_after()
        .is_some_and(|d| d <= Duration::from_secs(30)));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "the open breaker does not call the tool"
    );
}

#[tokio::test(start_paused = true)]
async fn matrix_after_the_open_wait_half_open_allows_one_test_call() {
    let calls = counter();
    let tool = scripted(&calls, |n, _| async move {
        if n <= 5 {
            Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(ToolResponse::new(json!("recovered")))
        }
    });
    let s = shield(NO_RETRY);
    let router = s
        .router()
        .tool("search", tool)
        .build()
        .expect("valid tool names");
    for _ in 0..5 {
        let _ = router.clone().oneshot(read("search", json!({}))).await;
    }
    tokio::time::advance(Duration::from_secs(31)).await;
    // two calls at once: one probe goes through, the other is rejected
    let (a, b) = tokio::join!(
        router.clone().oneshot(read("search", json!({"q": 1}))),
        router.clone().oneshot(read("search", json!({"q": 2})))
    );
    let kinds = [&a, &b].map(|r| r.as_ref().map(|_| "ok").unwrap_or_else(|e| e.code()));
    assert!(
        kinds.contains(&"ok") && kinds.contains(&"CIRCUIT_OPEN"),
        "{kinds:?}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        6,
        "exactly one probe reached the tool"
    );
    assert_eq!(
        s.breaker_for("search").state("search").to_string(),
        "closed"
    );
}

#[tokio::test(start_paused = true)]
async fn matrix_duplicate_concurrent_mutation_waits_or_fails_fast() {
    for (mode, expect_in_progress) in [("wait", false), ("fail_fast", true)] {
        let calls = counter();
        let tool = scripted(&calls, |n, _| async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(ToolResponse::new(json!({"charge": n})))
        });
        let cfg = format!(
            "[tools.pay]\nkind = \"mutating\"\nidempotency = {{ on_pending = \"{mode}\" }}\n"
        );
        let router = shield(&cfg)
            .router()
            .tool("pay", tool)
            .build()
            .expect("valid tool names");
        let req = || ToolRequest::new("pay", json!({"amount": 10})).idempotency_key("order-1");
        let (a, b) = tokio::join!(router.clone().oneshot(req()), async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            router.clone().oneshot(req()).await
        });
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "{mode}: the mutation ran once"
        );
        let a = a.unwrap();
        if expect_in_progress {
            assert_eq!(b.unwrap_err().kind(), ErrorKind::InProgress);
        } else {
            let b = b.unwrap();
            assert_eq!(a.output, b.output);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn matrix_duplicate_sequential_request_returns_the_stored_result() {
    let calls = counter();
    let tool = scripted(&calls, |n, _| async move {
        Ok(ToolResponse::new(json!({"charge": n})))
    });
    let router = shield("[tools.pay]\nkind = \"mutating\"\n")
        .router()
        .tool("pay", tool)
        .build()
        .expect("valid tool names");
    let req = || ToolRequest::new("pay", json!({"amount": 10})).idempotency_key("order-2");
    let first = router.clone().oneshot(req()).await.unwrap();
    let second = router.clone().oneshot(req()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(first.output, second.output);
    assert!(second.provenance.replayed);
    assert_eq!(second.provenance.fetched_at, first.provenance.fetched_at);
    let envelope = ToolResult::from(Ok::<_, ToolError>(second));
    assert!(
        envelope.from_cache,
        "the envelope says fromCache=true for a replay"
    );
}

#[tokio::test(start_paused = true)]
async fn matrix_a_network_timeout_is_retried_up_to_3_attempts_with_backoff() {
    let calls = counter();
    let tool = scripted(&calls, |_, _| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(ToolResponse::new(json!("late")))
    });
    let s = shield("[defaults]\ntimeout = { attempt = \"1s\", soft = \"500ms\" }\nretry = { max_attempts = 3 }\n");
    let router = s
        .router()
        .tool("search", tool)
        .build()
        .expect("valid tool names");
    let start = tokio::time::Instant::now();
    let err = router.oneshot(read("search", json!({}))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(err.attempts(), 3);
    // three 1 s attempts plus two backoff waits (full jitter: up to 0.5 s and 1 s)
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took <= Duration::from_millis(4500),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn matrix_a_bad_request_fails_at_once_without_retry() {
    let calls = counter();
    let tool = scripted(&calls, |_, _| async {
        Err(ToolError::invalid_input("400 bad request"))
    });
    let router = shield("")
        .router()
        .tool("search", tool)
        .build()
        .expect("valid tool names");
    let err = router.oneshot(read("search", json!({}))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------- audit findings

#[tokio::test(start_paused = true)]
async fn audit_breaker_state_is_shared_across_calls_and_separately_built_routers() {
    let calls = counter();
    let tool = scripted(&calls, |_, _| async {
        Err(ToolError::new(ErrorKind::ConnectionFailed, "down"))
    });
    let s = shield(NO_RETRY);
    let a = s
        .router()
        .tool("db", tool.clone())
        .build()
        .expect("valid tool names");
    let b = s
        .router()
        .tool("db", tool)
        .build()
        .expect("valid tool names");
    for i in 0..5 {
        let r = if i % 2 == 0 { a.clone() } else { b.clone() };
        let _ = r.oneshot(read("db", json!({}))).await;
    }
    let e = b.oneshot(read("db", json!({}))).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::CircuitOpen,
        "failures through either router count for one breaker"
    );
}

#[tokio::test(start_paused = true)]
async fn audit_full_path_cache_serves_while_the_breaker_is_open_with_provenance() {
    let calls = counter();
    let tool = scripted(&calls, |n, _| async move {
        if n == 1 {
            Ok(ToolResponse::new(json!({"temp": 21})))
        } else {
            Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
        }
    });
    let s = shield(
        "[defaults]\nretry = { max_attempts = 1 }\n[tools.weather]\nkind = \"read_only\"\ncache = { ttl = \"10m\" }\n",
    );
    let router = s
        .router()
        .tool("weather", tool)
        .build()
        .expect("valid tool names");
    let first = router
        .clone()
        .oneshot(read("weather", json!({"city": "Paris"})))
        .await
        .unwrap();
    assert!(!first.provenance.cache_hit);
    for i in 0..5 {
        let _ = router
            .clone()
            .oneshot(read("weather", json!({"city": i})))
            .await;
    }
    assert_eq!(
        router
            .clone()
            .oneshot(read("weather", json!({"city": "Rome"})))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::CircuitOpen
    );
    // the cached Paris answer still comes back, marked as a cache hit with its original time
    let cached = router
        .oneshot(read("weather", json!({"city": "Paris"})))
        .await
        .unwrap();
    assert!(cached.provenance.cache_hit);
    assert_eq!(cached.provenance.fetched_at, first.provenance.fetched_at);
    assert_eq!(cached.output, json!({"temp": 21}));
}

#[tokio::test(start_paused = true)]
async fn audit_soft_timeout_marks_slow_calls() {
    let calls = counter();
    let tool = scripted(&calls, |_, _| async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Ok(ToolResponse::new(json!("slow but fine")))
    });
    let router = shield("[defaults]\ntimeout = { attempt = \"4s\", soft = \"2s\" }\n")
        .router()
        .tool("search", tool)
        .build()
        .expect("valid tool names");
    let res = router.oneshot(read("search", json!({}))).await.unwrap();
    assert!(res.provenance.slow);
}

#[test]
fn audit_misconfigured_jitter_is_rejected_with_its_path() {
    let err = ShieldConfig::from_toml_str(
        "[tools.search.retry]\nbackoff = { strategy = \"fixed\", min = \"900ms\", max = \"500ms\" }\n",
    )
    .unwrap_err();
    assert!(
        err.problems()
            .iter()
            .any(|p| p.field.starts_with("tools.search.retry.backoff")),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn audit_per_tool_cache_ttl_is_selected_from_config() {
    let calls = counter();
    let tool = scripted(
        &calls,
        |n, _| async move { Ok(ToolResponse::new(json!(n))) },
    );
    let s = shield("[tools.weather]\nkind = \"read_only\"\ncache = { ttl = \"1m\" }\n");
    let router = s
        .router()
        .tool("weather", tool.clone())
        .tool("search", tool)
        .build()
        .expect("valid tool names");
    for _ in 0..2 {
        router
            .clone()
            .oneshot(read("weather", json!({})))
            .await
            .unwrap();
        router
            .clone()
            .oneshot(read("search", json!({})))
            .await
            .unwrap();
    }
    // weather cached (1 call), search not configured: default TTL 0, not cached (2 calls)
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    tokio::time::advance(Duration::from_secs(61)).await;
    router.oneshot(read("weather", json!({}))).await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "expired after the tool's own TTL"
    );
}

// ---------------------------------------------------------------- stack behaviour

#[tokio::test(start_paused = true)]
async fn cancellation_mid_call_is_not_counted_by_the_breaker() {
    let calls = counter();
    let tool = scripted(&calls, |_, _| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok(ToolResponse::new(json!("late")))
    });
    let s = shield(NO_RETRY);
    let router = s
        .router()
        .tool("search", tool)
        .build()
        .expect("valid tool names");
    for _ in 0..6 {
        let token = CancellationToken::new();
        let req = read("search", json!({})).cancel_token(token.clone());
        let call = tokio::spawn(router.clone().oneshot(req));
        tokio::time::sleep(Duration::from_millis(10)).await;
        token.cancel();
        assert_eq!(
            call.await.unwrap().unwrap_err().kind(),
            ErrorKind::Cancelled
        );
    }
    assert_eq!(
        s.breaker_for("search").state("search").to_string(),
        "closed"
    );
}

#[tokio::test(start_paused = true)]
async fn schema_validation_runs_before_everything_and_is_never_retried() {
    let calls = counter();
    let tool = scripted(&calls, |_, _| async {
        Ok(ToolResponse::new(json!("paid")))
    });
    let s = shield(
        "[tools.pay]\nkind = \"mutating\"\n[tools.pay.schema]\ntype = \"object\"\nrequired = [\"amount\"]\n",
    );
    let router = s
        .router()
        .tool("pay", tool)
        .build()
        .expect("valid tool names");
    let err = router
        .clone()
        .oneshot(ToolRequest::new("pay", json!({"amont": 5})).idempotency_key("k"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // the invalid call claimed no idempotency key: a valid call with the same key runs
    let ok = router
        .oneshot(ToolRequest::new("pay", json!({"amount": 5})).idempotency_key("k"))
        .await
        .unwrap();
    assert_eq!(ok.output, json!("paid"));
}

#[tokio::test(start_paused = true)]
async fn disabled_shield_is_a_pass_through() {
    let calls = counter();
    let tool = scripted(&calls, |_, _| async {
        Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
    });
    let cfg =
        ShieldConfig::from_value_with_env(json!({}), [("TOOLSHIELD_ENABLED", "false")]).unwrap();
    let router = Shield::from_config(cfg)
        .unwrap()
        .router()
        .tool("search", tool)
        .build()
        .expect("valid tool names");
    for _ in 0..8 {
        let e = router
            .clone()
            .oneshot(read("search", json!({})))
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::UpstreamUnavailable,
            "no retry, no breaker"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 8);
}

#[tokio::test]
async fn router_dispatches_by_name_mcp_servers_by_prefix_and_unknown_is_not_found() {
    let weather = BoxTool::new(service_fn(|_r: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!("weather")))
    }));
    let github = BoxTool::new(service_fn(|r: ToolRequest| async move {
        Ok::<_, ToolError>(ToolResponse::new(json!(r.tool().to_owned())))
    }));
    let mut router = RouterBuilder::unshielded()
        .tool("weather", weather)
        .server("github", github)
        .build()
        .expect("valid tool names");
    let res = router
        .ready()
        .await
        .unwrap()
        .call(read("weather", json!({})))
        .await
        .unwrap();
    assert_eq!(res.output, json!("weather"));
    let res = router
        .ready()
        .await
        .unwrap()
        .call(read("github__create_issue", json!({})))
        .await
        .unwrap();
    assert_eq!(res.output, json!("github__create_issue"));
    for unknown in ["nope", "github__", "gitlab__x"] {
        let e = router
            .ready()
            .await
            .unwrap()
            .call(read(unknown, json!({})))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{unknown}");
    }
}

#[tokio::test]
async fn a_server_route_takes_its_sections_kind_cache_schema_and_metrics_label() {
    let exporter = toolshield::metrics::local_prometheus();
    let s = shield(
        r#"
[tools.github]
kind = "read_only"
cache = { ttl = "1m" }
schema = { type = "object", required = ["repo"] }
"#,
    )
    .with_metrics(&exporter)
    .unwrap();
    let calls = counter();
    let github = scripted(&calls, |_, req| async move {
        Ok(ToolResponse::new(json!(req.tool().to_owned())))
    });
    let router = s
        .router()
        .server("github", github)
        .build()
        .expect("valid tool names");
    let call = |tool: &str, payload: Value| router.clone().oneshot(ToolRequest::new(tool, payload));

    let first = call("github__list_issues", json!({"repo": "a/b"}))
        .await
        .unwrap();
    assert_eq!(
        first.output,
        json!("github__list_issues"),
        "the tool sees its full name"
    );
    let again = call("github__list_issues", json!({"repo": "a/b"}))
        .await
        .unwrap();
    assert!(
        again.provenance.cache_hit,
        "the server section's kind and cache apply"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let sibling = call("github__list_prs", json!({"repo": "a/b"}))
        .await
        .unwrap();
    assert!(
        !sibling.provenance.cache_hit,
        "each tool of the server has its own entries"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let invalid = call("github__list_prs", json!({})).await.unwrap_err();
    assert_eq!(
        invalid.kind(),
        ErrorKind::InvalidInput,
        "the server section's schema"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let text = exporter.render();
    assert!(
        text.contains(r#"tool_execution_total{tool="github",status="success"} 3"#),
        "calls are labelled with the server's section, not `other`: {text}"
    );
    assert!(!text.contains(r#"tool="other""#), "{text}");
}

#[tokio::test(start_paused = true)]
async fn fallback_tier_answers_when_the_breaker_is_open_and_the_hand_over_is_a_metric() {
    let exporter = toolshield::metrics::local_prometheus();
    let s = shield("[defaults]\nretry = { max_attempts = 1 }\n[tools.llm]\nkind = \"read_only\"\n")
        .with_metrics(&exporter)
        .unwrap();
    let primary_calls = counter();
    let primary = scripted(&primary_calls, |_, _| async {
        Err(ToolError::new(ErrorKind::UpstreamUnavailable, "overloaded"))
    });
    let small_calls = counter();
    let small = scripted(&small_calls, |_, _| async {
        Ok(ToolResponse::new(json!("small model answer")))
    });
    let chain = toolshield_fallback::FallbackLayer::new().tier("small-model", small);
    let router = s
        .router()
        .tool_with_fallback("llm", primary, chain)
        .build()
        .expect("valid tool names");

    for _ in 0..7 {
        let res = router
            .clone()
            .oneshot(read("llm", json!({"prompt": "hi"})))
            .await
            .unwrap();
        assert_eq!(res.provenance.tier.as_deref(), Some("small-model"));
        assert_eq!(res.output, json!("small model answer"));
    }
    // 5 failures opened the primary's breaker: the last 2 calls never reached it
    assert_eq!(primary_calls.load(Ordering::SeqCst), 5);
    assert_eq!(small_calls.load(Ordering::SeqCst), 7);
    let text = exporter.render();
    assert!(
        text.contains(r#"tool_fallback_handovers_total{tool="llm",tier="small-model"} 7"#),
        "{text}"
    );
}

#[tokio::test]
async fn breaker_keys_chosen_by_a_model_never_reach_the_metrics_key_label() {
    let exporter = toolshield::metrics::local_prometheus();
    let s = shield(
        r#"
[tools.github]
kind = "read_only"
breaker = { consecutive_failures = 1 }
retry = { max_attempts = 1 }
"#,
    )
    .with_metrics(&exporter)
    .unwrap();
    let calls = counter();
    let github = scripted(&calls, |_, _req| async move {
        Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
    });
    let router = s
        .router()
        .server("github", github)
        .build()
        .expect("valid tool names");
    for i in 0..20 {
        let name = format!("github__alice.{i}@example.com");
        let _ = router
            .clone()
            .oneshot(ToolRequest::new(name, json!({})))
            .await;
    }
    let text = exporter.render();
    assert!(
        !text.contains("example.com"),
        "a model-chosen key leaked:\n{text}"
    );
    assert!(
        text.contains("circuit_breaker_state{key=\"other\""),
        "{text}"
    );
}
