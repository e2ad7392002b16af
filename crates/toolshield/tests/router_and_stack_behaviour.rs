//! The router and the default stack, observed from outside: breaker state shared by
//! every clone, unknown names answered with a bounded NOT_FOUND, and the layer order of
//! docs/layer-order.md seen through what each call does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield::prelude::*;
use toolshield_core::ToolService;
use tower::{service_fn, ServiceExt};

fn shield(toml: &str) -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(toml).expect("valid")).expect("shield")
}

/// A tool that fails with `UPSTREAM_UNAVAILABLE` while `failing` says so.
fn switchable(calls: &Arc<AtomicUsize>, failing: &Arc<AtomicUsize>) -> impl ToolService {
    let calls = Arc::clone(calls);
    let failing = Arc::clone(failing);
    service_fn(move |req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        let fail = failing.load(Ordering::SeqCst) == 1;
        async move {
            if fail {
                Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
            } else {
                Ok(ToolResponse::new(json!({"echo": req.payload().clone()})))
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn every_clone_of_a_router_and_every_router_of_a_shield_share_breaker_state() {
    let shield = shield("[defaults]\nretry = { max_attempts = 1 }\n");
    let calls = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicUsize::new(1));
    let router = shield
        .router()
        .tool("w", switchable(&calls, &failing))
        .build()
        .expect("router");
    let other_router = shield
        .router()
        .tool("w", switchable(&calls, &failing))
        .build()
        .expect("router");
    for i in 0..5 {
        let r = router
            .clone()
            .oneshot(ToolRequest::new("w", json!({"i": i})))
            .await;
        assert_eq!(r.expect_err("fails").kind(), ErrorKind::UpstreamUnavailable);
    }
    let before = calls.load(Ordering::SeqCst);
    let clone = router.clone();
    let e = clone
        .oneshot(ToolRequest::new("w", json!({})))
        .await
        .expect_err("open");
    assert_eq!(e.kind(), ErrorKind::CircuitOpen);
    let e = other_router
        .oneshot(ToolRequest::new("w", json!({})))
        .await
        .expect_err("open");
    assert_eq!(e.kind(), ErrorKind::CircuitOpen);
    let wrapped = shield.wrap("w", switchable(&calls, &failing));
    let e = wrapped
        .oneshot(ToolRequest::new("w", json!({})))
        .await
        .expect_err("open");
    assert_eq!(e.kind(), ErrorKind::CircuitOpen);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "an open breaker calls nothing"
    );
}

#[tokio::test]
async fn an_unknown_name_of_any_shape_is_a_bounded_not_found() {
    let shield = shield("");
    let router = shield
        .router()
        .tool(
            "w",
            service_fn(|_r: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!(1))) }),
        )
        .server(
            "srv",
            service_fn(|_r: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!(2))) }),
        )
        .build()
        .expect("router");
    let long = "x".repeat(1_000_000);
    let names = [
        String::new(),
        " ".to_owned(),
        long.clone(),
        format!("w\n{long}"),
        "w\u{0}".to_owned(),
        "\u{1b}[31mred".to_owned(),
        "other".to_owned(),
        "defaults".to_owned(),
        "__".to_owned(),
        "srv__".to_owned(),
        format!("srv__{long}"),
        "srv__a\nb".to_owned(),
        "{srv}__x".to_owned(),
        "W".to_owned(),
    ];
    for name in names {
        let e = router
            .clone()
            .oneshot(ToolRequest::new(name.as_str(), json!({})))
            .await
            .expect_err("not found");
        assert_eq!(
            e.kind(),
            ErrorKind::NotFound,
            "{:?}",
            &name[..name.len().min(20)]
        );
        assert!(e.message().len() < 400, "unbounded message");
        assert!(!e.message().contains('\n') && !e.message().contains('\u{1b}'));
        let m = e.for_model(&name);
        assert!(m.len() < 400 && !m.contains('\n'));
    }
    let before = shield.breakers().values().map(|r| r.len()).sum::<usize>();
    for i in 0..2_000 {
        let _ = router
            .clone()
            .oneshot(ToolRequest::new(format!("nobody_{i}").as_str(), json!({})))
            .await;
    }
    let after = shield.breakers().values().map(|r| r.len()).sum::<usize>();
    assert_eq!(before, after, "unknown names keep no breaker");
}

#[tokio::test(start_paused = true)]
async fn a_cached_answer_is_served_while_the_breaker_is_open_and_hits_do_not_count() {
    let shield = shield(
        r#"
        [defaults]
        retry = { max_attempts = 1 }
        [tools.q]
        kind = "read_only"
        cache = { ttl = "1h" }
        "#,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicUsize::new(0));
    let router = shield
        .router()
        .tool("q", switchable(&calls, &failing))
        .build()
        .expect("router");
    let cached = ToolRequest::new("q", json!({"city": "Paris"}));
    router.clone().oneshot(cached.clone()).await.expect("fresh");
    // Many hits: none reaches the breaker, so four failures after them do not open it
    // unless hits had counted (or cleared) anything.
    for _ in 0..50 {
        let hit = router.clone().oneshot(cached.clone()).await.expect("hit");
        assert!(hit.provenance.cache_hit);
    }
    failing.store(1, Ordering::SeqCst);
    for i in 0..5 {
        let _ = router
            .clone()
            .oneshot(ToolRequest::new("q", json!({"i": i})))
            .await;
    }
    assert_eq!(
        router
            .clone()
            .oneshot(ToolRequest::new("q", json!({"i": 99})))
            .await
            .expect_err("open")
            .kind(),
        ErrorKind::CircuitOpen
    );
    let hit = router.oneshot(cached).await.expect("served from the cache");
    assert!(hit.provenance.cache_hit);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

#[tokio::test(start_paused = true)]
async fn retries_happen_inside_the_total_deadline() {
    let shield = shield(
        r#"
        [tools.slow]
        kind = "read_only"
        timeout = { attempt = "2s", total = "3s" }
        retry = { max_attempts = 10, backoff = { strategy = "none" } }
        "#,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let tool = service_fn(move |_req: ToolRequest| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
        }
    });
    let router = shield.router().tool("slow", tool).build().expect("router");
    let start = tokio::time::Instant::now();
    let e = router
        .oneshot(ToolRequest::new("slow", json!({})))
        .await
        .expect_err("fails");
    let took = start.elapsed();
    assert!(took <= Duration::from_secs(3), "took {took:?}");
    assert!(
        calls.load(Ordering::SeqCst) <= 3,
        "{}",
        calls.load(Ordering::SeqCst)
    );
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Timeout | ErrorKind::UpstreamUnavailable
        ),
        "{e}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retried_mutation_keeps_one_claim_and_is_replayed_afterwards() {
    let shield = shield(
        r#"
        [tools.pay]
        kind = "mutating"
        retry = { backoff = { strategy = "none" } }
        "#,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let tool = service_fn(move |_req: ToolRequest| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(ToolError::new(ErrorKind::ConnectionFailed, "refused"))
            } else {
                Ok(ToolResponse::new(json!({"paid": n})))
            }
        }
    });
    let router = shield.router().tool("pay", tool).build().expect("router");
    let req = ToolRequest::new("pay", json!({"amount": 5})).idempotency_key("k-1");
    let first = router
        .clone()
        .oneshot(req.clone())
        .await
        .expect("retried inside one claim");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let again = router.oneshot(req).await.expect("replayed");
    assert!(again.provenance.replayed);
    assert_eq!(again.output, first.output);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn invalid_arguments_never_reach_the_tool_nor_the_breaker() {
    let shield = shield(
        r#"
        [tools.v]
        kind = "read_only"
        schema = { type = "object", required = ["city"], properties = { city = { type = "string" } } }
        "#,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicUsize::new(0));
    let router = shield
        .router()
        .tool("v", switchable(&calls, &failing))
        .build()
        .expect("router");
    for _ in 0..20 {
        let e = router
            .clone()
            .oneshot(ToolRequest::new(
                "v",
                json!({"city": 4111_1111_1111_1111u64}),
            ))
            .await
            .expect_err("invalid");
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(!e.message().contains("4111"), "{}", e.message());
        assert!(!e.is_retriable());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    router
        .oneshot(ToolRequest::new("v", json!({"city": "Paris"})))
        .await
        .expect("breaker still closed");
}

#[tokio::test]
async fn a_cancelled_call_is_cancelled_even_with_a_cached_answer() {
    let shield = shield("[tools.q]\nkind = \"read_only\"\ncache = { ttl = \"1h\" }\n");
    let calls = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicUsize::new(0));
    let router = shield
        .router()
        .tool("q", switchable(&calls, &failing))
        .build()
        .expect("router");
    router
        .clone()
        .oneshot(ToolRequest::new("q", json!({"a": 1})))
        .await
        .expect("fresh");
    let token = CancellationToken::new();
    token.cancel();
    let e = router
        .oneshot(ToolRequest::new("q", json!({"a": 1})).cancel_token(token))
        .await
        .expect_err("cancelled");
    assert_eq!(e.kind(), ErrorKind::Cancelled);
}

#[tokio::test]
async fn a_disabled_shield_passes_calls_through_untouched() {
    let cfg = ShieldConfig::from_value_with_env(
        json!({"tools": {"v": {"kind": "read_only", "schema": {"type": "object", "required": ["x"]}}}}),
        [("TOOLSHIELD_ENABLED", "false")],
    )
    .expect("valid");
    let shield = Shield::from_config(cfg).expect("shield");
    let calls = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicUsize::new(0));
    let router = shield
        .router()
        .tool("v", switchable(&calls, &failing))
        .build()
        .expect("router");
    router
        .clone()
        .oneshot(ToolRequest::new("v", json!({})))
        .await
        .expect("not validated when off");
    let e = router
        .oneshot(ToolRequest::new("nope", json!({})))
        .await
        .expect_err("still routed by name");
    assert_eq!(e.kind(), ErrorKind::NotFound);
}

#[test]
fn every_error_kind_round_trips_through_the_envelope() {
    for kind in ErrorKind::ALL {
        let result = ToolResult::from(ToolError::new(kind, "m"));
        let text = serde_json::to_string(&result).expect("serialises");
        let back: ToolResult = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, result);
        let error = back.error.expect("error");
        assert_eq!(ErrorKind::from_code(&error.code), Some(kind));
        assert_eq!(error.retriable, kind.is_retriable());
        let as_json = serde_json::to_value(kind).expect("kind serialises");
        assert_eq!(as_json, json!(kind.code()));
        let parsed: ErrorKind = serde_json::from_value(as_json).expect("kind parses");
        assert_eq!(parsed, kind);
    }
}

#[test]
fn a_malformed_envelope_is_an_error_never_a_panic() {
    for text in [
        r#"{"status":"success","data":null,"error":null,"durationMs":1e400,"fromCache":false,"provenance":null}"#,
        r#"{"status":"success","data":null,"error":null,"durationMs":-1,"fromCache":false,"provenance":null}"#,
        r#"{"status":"success","data":null,"error":null,"durationMs":184467440737095516150,"fromCache":false,"provenance":null}"#,
        r#"{"status":"nope","data":null,"error":null,"durationMs":1,"fromCache":false,"provenance":null}"#,
        r#"{"status":"error","data":null,"error":{"code":1,"message":[],"retriable":"yes"},"durationMs":1,"fromCache":false,"provenance":null}"#,
        r#"{"status":"success","data":null,"error":null,"durationMs":1,"fromCache":false,"provenance":{"attempts":-3,"duration":{"secs":18446744073709551615,"nanos":4294967295}}}"#,
        r#"{"status":"success","data":null,"error":null,"durationMs":1,"fromCache":false,"provenance":{"fetched_at":"99999-99-99"}}"#,
        r#"[]"#,
        r#""#,
    ] {
        let _ = serde_json::from_str::<ToolResult>(text);
    }
    assert!(serde_json::from_str::<ErrorKind>(r#""TOOL_EXECUTION_FAILED""#).is_err());
    assert!(serde_json::from_str::<ErrorKind>("17").is_err());
}

#[test]
fn text_for_the_model_carries_no_message_and_the_retriable_table_holds() {
    let secret = "sk-live-4111111111111111 password=hunter2";
    for kind in ErrorKind::ALL {
        let e = ToolError::new(kind, secret).with_retry_after(Duration::from_secs(7));
        let text = e.for_model("pay");
        assert!(
            !text.contains("4111") && !text.contains("hunter2"),
            "{text}"
        );
        assert!(text.contains("pay"), "{text}");
    }
    let retriable: Vec<_> = ErrorKind::ALL
        .into_iter()
        .filter(|k| k.is_retriable())
        .collect();
    for never in [
        ErrorKind::InvalidInput,
        ErrorKind::Unauthorized,
        ErrorKind::NotFound,
        ErrorKind::CircuitOpen,
        ErrorKind::Cancelled,
        ErrorKind::IdempotencyKeyReused,
        ErrorKind::OutcomeUnknown,
        ErrorKind::BudgetExhausted,
    ] {
        assert!(!retriable.contains(&never), "{never} retriable");
    }
    for counted in [ErrorKind::RateLimited, ErrorKind::Unauthorized] {
        assert!(counted.counts_for_breaker());
    }
    for not_counted in [
        ErrorKind::Cancelled,
        ErrorKind::InvalidInput,
        ErrorKind::NotFound,
        ErrorKind::IdempotencyKeyReused,
        ErrorKind::InProgress,
    ] {
        assert!(!not_counted.counts_for_breaker(), "{not_counted}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_success_is_marked_slow_and_every_answer_carries_provenance() {
    let shield = shield("[tools.q]\nkind = \"read_only\"\ncache = { ttl = \"1h\" }\n");
    let tool = service_fn(|_req: ToolRequest| async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Ok::<_, ToolError>(ToolResponse::new(json!({"t": 1})))
    });
    let router = shield.router().tool("q", tool).build().expect("router");
    let fresh = router
        .clone()
        .oneshot(ToolRequest::new("q", json!({"a": 1})))
        .await
        .expect("slow but fine");
    let p = &fresh.provenance;
    assert!(p.slow, "{p:?}");
    assert!(!p.cache_hit);
    assert_eq!(p.attempts, 1, "{p:?}");
    assert_eq!(p.tool.as_deref(), Some("q"), "{p:?}");
    assert!(p.fetched_at.is_some() && p.duration.is_some(), "{p:?}");
    tokio::time::advance(Duration::from_secs(60)).await;
    let hit = router
        .oneshot(ToolRequest::new("q", json!({"a": 1})))
        .await
        .expect("hit");
    assert!(hit.provenance.cache_hit);
    assert_eq!(
        hit.provenance.fetched_at, p.fetched_at,
        "original fetch time kept"
    );
    let result = ToolResult::from(Ok::<_, ToolError>(hit));
    assert!(result.from_cache);
}

#[tokio::test(start_paused = true)]
async fn a_tool_without_a_section_runs_under_the_defaults() {
    let shield = shield(
        r#"
        [defaults]
        kind = "idempotent"
        retry = { max_attempts = 4, backoff = { strategy = "none" } }
        [tools.listed]
        retry = { max_attempts = 1 }
        "#,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicUsize::new(1));
    let router = shield
        .router()
        .tool("unlisted", switchable(&calls, &failing))
        .build()
        .expect("router");
    let e = router
        .oneshot(ToolRequest::new("unlisted", json!({})))
        .await
        .expect_err("fails");
    assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the defaults' four attempts"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_call_is_not_retried_and_never_opens_the_breaker() {
    let shield = shield("[tools.r]\nkind = \"read_only\"\n");
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let tool = service_fn(move |req: ToolRequest| {
        c.fetch_add(1, Ordering::SeqCst);
        let token = req.attempt_token().clone();
        async move {
            tokio::select! {
                _ = token.cancelled() => {
                    Err(ToolError::cancelled("stopped"))
                }
                _ = tokio::time::sleep(Duration::from_secs(20)) => {
                    Ok(ToolResponse::new(json!({})))
                }
            }
        }
    });
    let router = shield.router().tool("r", tool).build().expect("router");
    for i in 0..10 {
        let token = CancellationToken::new();
        let call = tokio::spawn(
            router
                .clone()
                .oneshot(ToolRequest::new("r", json!({"i": i})).cancel_token(token.clone())),
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        token.cancel();
        let e = call.await.expect("joined").expect_err("cancelled");
        assert_eq!(e.kind(), ErrorKind::Cancelled);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        10,
        "no retry of a cancelled call"
    );
    let ok = router
        .oneshot(ToolRequest::new("r", json!({"i": "last"})))
        .await;
    assert!(ok.is_ok(), "breaker still closed: {ok:?}");
}

#[tokio::test]
async fn the_envelope_has_the_documented_json_shape() {
    let shield = shield("[tools.weather]\nkind = \"read_only\"\ncache = { ttl = \"1h\" }\n");
    let tool = service_fn(|_req: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!({"city": "Paris", "temp_c": 21})))
    });
    let router = shield
        .router()
        .tool("weather", tool)
        .build()
        .expect("router");
    let req = ToolRequest::new("weather", json!({"city": "Paris"}));
    let _ = router.clone().oneshot(req.clone()).await;
    let hit: ToolResult = router.clone().oneshot(req).await.into();
    let v = serde_json::to_value(&hit).expect("json");
    let mut top: Vec<_> = v.as_object().expect("object").keys().cloned().collect();
    top.sort();
    assert_eq!(
        top,
        [
            "data",
            "durationMs",
            "error",
            "fromCache",
            "provenance",
            "status"
        ]
    );
    assert_eq!(v["status"], "success");
    assert_eq!(v["fromCache"], true);
    let p = v["provenance"].as_object().expect("provenance");
    for key in [
        "source",
        "tool",
        "fetchedAt",
        "cacheHit",
        "replayed",
        "stale",
        "slow",
        "attempts",
        "executionId",
        "traceId",
        "durationMs",
        "responseDigest",
        "tier",
    ] {
        assert!(p.contains_key(key), "{key} missing in {v}");
    }
    let missing: ToolResult = router
        .oneshot(ToolRequest::new("nope", json!({})))
        .await
        .into();
    assert_eq!(
        serde_json::to_value(&missing).expect("json"),
        json!({"status":"error","data":null,"error":{"code":"NOT_FOUND","message":"no tool named `nope` is registered","retriable":false},"durationMs":0,"fromCache":false,"provenance":null})
    );
}

#[tokio::test(start_paused = true)]
async fn names_a_model_invents_behind_a_server_keep_the_breaker_map_bounded() {
    let shield = shield("[defaults]\nretry = { max_attempts = 1 }\nbreaker = { max_keys = 100 }\n");
    let calls = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicUsize::new(1));
    let router = shield
        .router()
        .server("srv", switchable(&calls, &failing))
        .build()
        .expect("router");
    for i in 0..1_000 {
        let _ = router
            .clone()
            .oneshot(ToolRequest::new(format!("srv__t{i}").as_str(), json!({})))
            .await;
    }
    let held: usize = shield.breakers().values().map(|r| r.len()).sum();
    assert!(held <= 100, "{held} breakers held");
}

/// A tool that is never ready: its capacity is taken for good.
#[derive(Clone)]
struct NeverReady;

impl tower::Service<ToolRequest> for NeverReady {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = std::future::Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ToolError>> {
        std::task::Poll::Pending
    }

    fn call(&mut self, _req: ToolRequest) -> Self::Future {
        std::future::ready(Ok(ToolResponse::new(json!({}))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_a_busy_tool_ends_at_its_deadline_or_cancellation() {
    let shield = shield(
        "[tools.busy]\nkind = \"read_only\"\n\
         [tools.busy2]\nkind = \"read_only\"\ntimeout = { attempt = \"2s\", total = \"3s\" }\n",
    );
    let router = shield
        .router()
        .tool("busy", NeverReady)
        .tool("busy2", NeverReady)
        .build()
        .expect("router");
    let start = tokio::time::Instant::now();
    let token = CancellationToken::new();
    let waiting = tokio::spawn(
        router
            .clone()
            .oneshot(ToolRequest::new("busy", json!({"n": 2})).cancel_token(token.clone())),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    token.cancel();
    let r = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    let e = r
        .expect("a cancelled call stops waiting for readiness")
        .expect("joined")
        .expect_err("cancelled");
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");

    let waiting = tokio::spawn(
        router
            .clone()
            .oneshot(ToolRequest::new("busy2", json!({"n": 2}))),
    );
    let r = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    let e = r
        .expect("a call stops waiting for readiness at its total deadline")
        .expect("joined")
        .expect_err("times out");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(start.elapsed() <= Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_a_busy_tool_ends_at_the_deadline_the_caller_gave() {
    let shield = shield("[tools.busy]\nkind = \"read_only\"\n");
    let router = shield
        .router()
        .tool("busy", NeverReady)
        .build()
        .expect("router");
    let at = tokio::time::Instant::now() + Duration::from_secs(2);
    let waiting = tokio::spawn(
        router
            .clone()
            .oneshot(ToolRequest::new("busy", json!({})).deadline(at)),
    );
    let e = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("ends at the caller's deadline")
        .expect("joined")
        .expect_err("times out");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(tokio::time::Instant::now(), at);
}
