//! Flow control from one configuration: run budgets, bulkheads, rate limits, hedging and
//! fault injection, each set in a tool's section and placed in the default stack.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::problem_fields;
use tower::{service_fn, ServiceExt};

fn shield(toml: &str) -> Shield {
    let cfg = ShieldConfig::from_toml_str(toml).unwrap_or_else(|e| panic!("{e}"));
    Shield::from_config(cfg).unwrap_or_else(|e| panic!("{e}"))
}

/// A tool that counts its calls and answers after `delay`.
fn counting(
    delay: Duration,
) -> (
    impl tower::Service<
            ToolRequest,
            Response = ToolResponse,
            Error = ToolError,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let svc = service_fn(move |_req: ToolRequest| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, ToolError>(ToolResponse::new(json!({"ok": true})))
        }
    });
    (svc, calls)
}

#[tokio::test(start_paused = true)]
async fn a_run_budget_admits_exactly_its_limit_under_100_concurrent_calls() {
    let shield = shield(
        r#"
        [tools.search]
        kind = "read_only"
        budget = { max_calls = 10 }
        "#,
    );
    let (tool, calls) = counting(Duration::from_millis(50));
    let svc = shield.wrap("search", tool);
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let req = ToolRequest::new("search", json!({ "q": i }))
                    .kind(CallKind::ReadOnly)
                    .run_id("run-1");
                svc.oneshot(req).await
            })
        })
        .collect();
    let mut ok = 0;
    let mut exhausted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::BudgetExhausted, "{e}");
                assert!(e.for_model("search").contains("Do not call `search` again"));
                exhausted += 1;
            }
        }
    }
    assert_eq!((ok, exhausted), (10, 90));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        10,
        "a rejected call never ran"
    );

    // Another run has its own budget; the exhausted error was not retried.
    let other = ToolRequest::new("search", json!({"q": "x"}))
        .kind(CallKind::ReadOnly)
        .run_id("run-2");
    assert!(svc.clone().oneshot(other).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_run_wide_limit_counts_the_calls_of_every_tool() {
    let shield = shield(
        r#"
        [runs]
        run_max_calls = 3

        [tools.a]
        kind = "read_only"

        [tools.b]
        kind = "read_only"
        "#,
    );
    let a = shield.wrap("a", counting(Duration::ZERO).0);
    let b = shield.wrap("b", counting(Duration::ZERO).0);
    let call = |svc: &_, tool: &str, i: u32| {
        let req = ToolRequest::new(tool, json!({ "i": i }))
            .kind(CallKind::ReadOnly)
            .run_id("run");
        ServiceExt::<ToolRequest>::oneshot(Clone::clone(svc), req)
    };
    assert!(call(&a, "a", 1).await.is_ok());
    assert!(call(&b, "b", 2).await.is_ok());
    assert!(call(&a, "a", 3).await.is_ok());
    let e = call(&b, "b", 4).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
}

#[tokio::test(start_paused = true)]
async fn a_full_bulkhead_rejects_at_once_with_overloaded_and_the_breaker_does_not_count_it() {
    let shield = shield(
        r#"
        [tools.slow]
        kind = "read_only"
        retry = { max_attempts = 1 }
        breaker = { consecutive_failures = 1 }
        bulkhead = { max_concurrent = 2, max_queue = 0 }
        "#,
    );
    let (tool, calls) = counting(Duration::from_secs(1));
    let svc = shield.wrap("slow", tool);
    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                svc.oneshot(ToolRequest::new("slow", json!({ "i": i })).kind(CallKind::ReadOnly))
                    .await
            })
        })
        .collect();
    let mut kinds = Vec::new();
    for t in tasks {
        kinds.push(t.await.unwrap().map(|_| ()).map_err(|e| e.kind()));
    }
    let rejected = kinds
        .iter()
        .filter(|k| **k == Err(ErrorKind::Overloaded))
        .count();
    assert_eq!(rejected, 3, "{kinds:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // One failure would open this breaker: OVERLOADED is not a failure of the tool.
    let after = svc
        .oneshot(ToolRequest::new("slow", json!({"i": 9})).kind(CallKind::ReadOnly))
        .await;
    assert!(after.is_ok(), "{after:?}");
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_rejects_with_the_exact_wait() {
    let shield = shield(
        r#"
        [tools.api]
        kind = "read_only"
        retry = { max_attempts = 1 }
        rate_limit = { rate = 1, period = "10s", burst = 1, on_limit = "reject" }
        "#,
    );
    let svc = shield.wrap("api", counting(Duration::ZERO).0);
    let req = |i: u32| ToolRequest::new("api", json!({ "i": i })).kind(CallKind::ReadOnly);
    assert!(svc.clone().oneshot(req(1)).await.is_ok());
    let e = svc.clone().oneshot(req(2)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RateLimited);
    assert_eq!(e.retry_after(), Some(Duration::from_secs(10)));
    assert!(
        e.for_model("api").contains("Wait 10 seconds"),
        "{}",
        e.for_model("api")
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(svc.oneshot(req(3)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_slow_read_is_hedged_and_provenance_says_which_attempt_answered() {
    let shield = shield(
        r#"
        [tools.read]
        kind = "read_only"
        hedge = { enabled = true, delay = "100ms", max_hedges = 1 }
        "#,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    // The first attempt hangs; the hedge answers at once.
    let tool = service_fn(move |req: ToolRequest| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                req.attempt_token().cancelled().await;
                return Err(ToolError::cancelled("lost the race"));
            }
            Ok::<_, ToolError>(ToolResponse::new(json!({"answer": n})))
        }
    });
    let res = shield
        .wrap("read", tool)
        .oneshot(ToolRequest::new("read", json!({})).kind(CallKind::ReadOnly))
        .await
        .unwrap();
    assert_eq!(res.output, json!({"answer": 1}));
    assert_eq!(res.provenance.hedge_answered_by, Some(2));
    assert_eq!(res.provenance.hedges_sent, Some(2));
}

#[test]
fn hedging_a_mutating_tool_is_refused_at_load_with_the_other_problems() {
    let err = ShieldConfig::from_toml_str(
        r#"
        [tools.pay]
        kind = "mutating"
        hedge = { enabled = true, delay = "100ms" }
        bulkhead = { max_concurrent = 0 }
        faults = { enabled = true, latency = { rate = 1.5, delay = "1s" } }
        "#,
    )
    .unwrap_err();
    let fields = problem_fields(&err);
    assert!(fields.contains(&"tools.pay.hedge.enabled"), "{err}");
    assert!(
        fields.iter().any(|f| f.starts_with("tools.pay.bulkhead")),
        "{err}"
    );
    assert!(
        fields.iter().any(|f| f.starts_with("tools.pay.faults")),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn injected_faults_reach_the_caller_and_the_breaker_sees_them() {
    let shield = shield(
        r#"
        [tools.chaos]
        kind = "read_only"
        retry = { max_attempts = 1 }
        breaker = { consecutive_failures = 2 }
        faults = { enabled = true, seed = 7, error = { rate = 1.0, kind = "UPSTREAM_UNAVAILABLE" } }
        "#,
    );
    let (tool, calls) = counting(Duration::ZERO);
    let svc = shield.wrap("chaos", tool);
    let req = || ToolRequest::new("chaos", json!({})).kind(CallKind::ReadOnly);
    for _ in 0..2 {
        let e = svc.clone().oneshot(req()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
    }
    // Injected inside the breaker: two injected failures open it, as real ones would.
    let e = svc.oneshot(req()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CircuitOpen);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the tool was never called");
}

#[test]
fn an_attempt_timeout_alone_loads_even_below_the_built_in_soft_threshold() {
    let cfg = ShieldConfig::from_toml_str(
        r#"
        [defaults]
        timeout = { attempt = "1s" }

        [tools.quick]
        timeout = { attempt = "500ms" }
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.defaults.timeout.soft, None);
    assert_eq!(cfg.tool("quick").timeout.soft, None);
    // A threshold someone wrote is still checked.
    let err = ShieldConfig::from_toml_str(
        r#"
        [defaults]
        timeout = { attempt = "1s", soft = "2s" }
        "#,
    )
    .unwrap_err();
    assert_eq!(problem_fields(&err), ["defaults.timeout.soft"]);
    // And a tool with a long attempt keeps the built-in threshold.
    let cfg = ShieldConfig::from_toml_str("[tools.slow]\ntimeout = { attempt = \"30s\" }")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.tool("slow").timeout.soft, Some(Duration::from_secs(2)));
}

#[tokio::test(start_paused = true)]
async fn a_call_with_invalid_arguments_spends_the_budget_too() {
    let shield = shield(
        r#"
        [tools.find]
        kind = "read_only"
        budget = { max_calls = 2 }
        schema = { type = "object", required = ["q"] }
        "#,
    );
    let (tool, calls) = counting(Duration::ZERO);
    let svc = shield.wrap("find", tool);
    let req = |payload| {
        ToolRequest::new("find", payload)
            .kind(CallKind::ReadOnly)
            .run_id("loop")
    };
    // A model looping on bad arguments is stopped like any other loop.
    for _ in 0..2 {
        let e = svc.clone().oneshot(req(json!({}))).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
    let e = svc.oneshot(req(json!({"q": "x"}))).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BudgetExhausted);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// A limit per tool holds across every wrap of the tool: two services wrapped under one
/// name share one bulkhead and one rate bucket, and `/metrics` shows each series once.
#[tokio::test(start_paused = true)]
async fn two_wraps_of_one_tool_share_its_bulkhead_rate_limit_and_series() {
    let exporter = toolshield::metrics::local_prometheus();
    let shield = shield(
        r#"
        [tools.slow]
        kind = "read_only"
        retry = { max_attempts = 1 }
        bulkhead = { max_concurrent = 1, max_queue = 0 }
        rate_limit = { rate = 3, period = "10s", burst = 3, on_limit = "reject" }
        "#,
    )
    .with_metrics(&exporter)
    .unwrap_or_else(|e| panic!("{e}"));
    let (tool, calls) = counting(Duration::from_secs(1));
    let a = shield.wrap("slow", tool.clone());
    let b = shield.wrap("slow", tool);
    let req = |i: u32| ToolRequest::new("slow", json!({ "i": i })).kind(CallKind::ReadOnly);
    let first = tokio::spawn(a.clone().oneshot(req(1)));
    tokio::task::yield_now().await;
    // The other wrap finds the one permit taken.
    let e = b.clone().oneshot(req(2)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Overloaded);
    assert!(first.await.unwrap().is_ok());
    // One bucket of three turns for both wraps (the rate limit sits outside the bulkhead,
    // so the call the bulkhead refused took a turn too): a third call gets the last turn,
    // then the bucket is empty for either wrap.
    assert!(b.clone().oneshot(req(3)).await.is_ok());
    let e = a.oneshot(req(4)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RateLimited);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let text = exporter.render();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("tool=\"slow\""))
        .filter(|l| l.starts_with("tool_bulkhead") || l.starts_with("tool_rate_limit"))
        .map(|l: &str| l.rsplit_once(" ").map_or(l, |(name, _)| name))
        .collect();
    assert!(!series.is_empty(), "{text}");
    let mut unique = series.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(series.len(), unique.len(), "a series twice: {series:?}");
}
