//! The tool executor's documented behaviour, through the default stack built from the
//! executor's own settings as docs/migration.md translates them (4 s hard and 2 s soft
//! timeout per attempt, one retry after a uniform 200-500 ms wait, a breaker of 5
//! failures opening for 30 s, a one-hour cache): timeouts fresh for each attempt, retry
//! waits inside the jitter range, the breaker counting timeouts and shared by every clone,
//! concurrent identical misses running the tool once, provenance on every result, the soft
//! timeout marking, counting and tripping, and the documented metric names, labels and
//! values. Every timing test runs on tokio's paused clock.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield::config::ShieldConfig;
use toolshield::shield::{BoxTool, Shield, ToolRouter};
use toolshield_breaker::{BreakerConfig, BreakerLayer, CircuitState};
use toolshield_core::canonical::payload_digest;
use toolshield_core::{
    utc_at, CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolResult,
};
use toolshield_test::exposition::parse;
use tower::{service_fn, Layer, ServiceExt};

/// The executor's `ToolConfig(soft_timeout_ms=2000, hard_timeout_ms=4000, retry_count=1,
/// retry_jitter_min_ms=200, retry_jitter_max_ms=500, breaker_failure_threshold=5,
/// breaker_window_seconds=60, breaker_half_open_seconds=30, cache_ttl_seconds=3600)`,
/// as docs/migration.md writes it, for `weather`; `flights` takes the same settings
/// without the cache.
const EXECUTOR_SETTINGS: &str = r#"
[defaults]
kind = "read_only"
timeout = { attempt = "4s", soft = "2s" }
retry = { max_attempts = 2, backoff = { strategy = "fixed", min = "200ms", max = "500ms" } }
breaker = { consecutive_failures = 5, open_wait = "30s", window = { type = "time", duration = "60s", buckets = 12 } }

[tools.weather]
cache = { ttl = "1h" }
"#;

const JITTER_MIN: Duration = Duration::from_millis(200);
const JITTER_MAX: Duration = Duration::from_millis(500);
const HARD: Duration = Duration::from_secs(4);

/// When each call reached the tool, measured from the test's start.
#[derive(Clone)]
struct Calls {
    start: Instant,
    at: Arc<Mutex<Vec<Duration>>>,
}

impl Calls {
    fn new() -> Self {
        Calls {
            start: Instant::now(),
            at: Arc::default(),
        }
    }

    /// Records a call; returns its number, from 1.
    fn record(&self) -> usize {
        let mut at = self.at.lock().unwrap();
        at.push(self.start.elapsed());
        at.len()
    }

    fn times(&self) -> Vec<Duration> {
        self.at.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.at.lock().unwrap().len()
    }
}

/// A tool that records each call and answers as `script(call number, request)` says.
fn tool<F, Fut>(calls: &Calls, script: F) -> BoxTool
where
    F: Fn(usize, ToolRequest) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<ToolResponse, ToolError>> + Send + 'static,
{
    let calls = calls.clone();
    BoxTool::new(service_fn(move |req: ToolRequest| {
        let n = calls.record();
        script(n, req)
    }))
}

fn shield(config: &str) -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(config).expect("valid config")).expect("shield")
}

fn router(shield: &Shield, name: &str, tool: BoxTool) -> ToolRouter {
    shield.router().tool(name, tool).build().expect("router")
}

fn read(tool: &str, payload: Value) -> ToolRequest {
    ToolRequest::new(tool, payload).kind(CallKind::ReadOnly)
}

fn unavailable() -> ToolError {
    ToolError::new(ErrorKind::UpstreamUnavailable, "503 from upstream")
}

// ------------------------------------------------------------------ timeouts and retries

#[tokio::test(start_paused = true)]
async fn each_attempt_gets_the_full_hard_timeout_after_a_wait_within_the_jitter_range() {
    let calls = Calls::new();
    let hung = tool(&calls, |_, _| std::future::pending());
    let router = router(&shield(EXECUTOR_SETTINGS), "flights", hung);

    let started = Instant::now();
    let err = router
        .oneshot(read("flights", json!({"from": "SFO"})))
        .await
        .unwrap_err();
    let took = started.elapsed();

    assert_eq!(err.kind(), ErrorKind::Timeout);
    let times = calls.times();
    assert_eq!(times.len(), 2, "retry_count = 1: two attempts, {times:?}");
    assert_eq!(times[0], Duration::ZERO);
    let wait = times[1] - HARD;
    assert!(
        (JITTER_MIN..=JITTER_MAX).contains(&wait),
        "the retry started {wait:?} after the first attempt timed out"
    );
    assert_eq!(
        took,
        times[1] + HARD,
        "the second attempt had the full 4 s, not what was left of a shared budget"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_waits_are_spread_over_the_jitter_range() {
    let calls = Calls::new();
    // Odd calls fail, even calls succeed: every logical call is one failure, one retry.
    let flaky = tool(&calls, |n, _| async move {
        if n % 2 == 1 {
            Err(unavailable())
        } else {
            Ok(ToolResponse::new(json!({"ok": n})))
        }
    });
    let router = router(&shield(EXECUTOR_SETTINGS), "flights", flaky);
    let mut waits = BTreeSet::new();
    for i in 0..40 {
        let before = calls.count();
        let res = router
            .clone()
            .oneshot(read("flights", json!({ "i": i })))
            .await
            .unwrap();
        assert_eq!(res.provenance.attempts, 2);
        let times = calls.times();
        let wait = times[before + 1] - times[before];
        assert!(
            (JITTER_MIN..=JITTER_MAX).contains(&wait),
            "call {i}: retry after {wait:?}"
        );
        waits.insert(wait);
        // Past the breaker's 60 s window: half of the attempts failing would open it.
        tokio::time::advance(Duration::from_secs(61)).await;
    }
    assert!(
        waits.len() > 10,
        "40 retries should not wait the same few times: {waits:?}"
    );
}

// ------------------------------------------------------------------ circuit breaker

#[tokio::test(start_paused = true)]
async fn hard_timeouts_count_as_breaker_failures_and_an_open_breaker_calls_no_tool() {
    let calls = Calls::new();
    let hung = tool(&calls, |_, _| std::future::pending());
    let s = shield(EXECUTOR_SETTINGS);
    let router = router(&s, "flights", hung);

    // Two attempts per call, each a timeout: the fifth timed-out attempt opens the breaker.
    for i in 0..3 {
        let _ = router
            .clone()
            .oneshot(read("flights", json!({ "i": i })))
            .await;
    }
    assert_eq!(
        calls.count(),
        5,
        "the attempt after the fifth failure is refused"
    );
    assert_eq!(
        s.breaker_for("flights").state("flights"),
        CircuitState::Open
    );

    let started = Instant::now();
    let err = router
        .oneshot(read("flights", json!({"i": 9})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(started.elapsed(), Duration::ZERO, "fails fast");
    assert_eq!(calls.count(), 5, "no tool call while open");
    let left = err
        .retry_after()
        .expect("an open breaker says when to come back");
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(30),
        "{left:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_half_open_probe_reopens_for_another_full_wait() {
    let calls = Calls::new();
    let recovered = Arc::new(AtomicU32::new(0));
    let flag = recovered.clone();
    let flaky = tool(&calls, move |_, _| {
        let up = flag.load(Ordering::SeqCst) == 1;
        async move {
            if up {
                Ok(ToolResponse::new(json!("up")))
            } else {
                Err(unavailable())
            }
        }
    });
    let s = shield(EXECUTOR_SETTINGS);
    let router = router(&s, "flights", flaky);
    let breaker = s.breaker_for("flights");
    while breaker.state("flights") != CircuitState::Open {
        let _ = router.clone().oneshot(read("flights", json!({}))).await;
    }
    let before = calls.count();

    tokio::time::advance(Duration::from_secs(30)).await;
    let err = router
        .clone()
        .oneshot(read("flights", json!({})))
        .await
        .unwrap_err();
    assert_eq!(
        calls.count(),
        before + 1,
        "one probe after the wait, no second attempt once it failed"
    );
    assert_eq!(err.kind(), ErrorKind::CircuitOpen, "{err}");
    assert_eq!(breaker.state("flights"), CircuitState::Open);

    // The timer restarted at the failed probe: still open 29 s later.
    tokio::time::advance(Duration::from_secs(29)).await;
    let err = router
        .clone()
        .oneshot(read("flights", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(calls.count(), before + 1);

    recovered.store(1, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(1)).await;
    router
        .clone()
        .oneshot(read("flights", json!({})))
        .await
        .expect("the probe after the full wait succeeds");
    assert_eq!(breaker.state("flights"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn one_tools_open_breaker_leaves_other_tools_closed() {
    let calls = Calls::new();
    let s = shield(EXECUTOR_SETTINGS);
    let failing = tool(&calls, |_, _| async { Err(unavailable()) });
    let fine = tool(&calls, |_, _| async { Ok(ToolResponse::new(json!("ok"))) });
    let router = s
        .router()
        .tool("flights", failing)
        .tool("fx_rates", fine)
        .build()
        .unwrap();
    for _ in 0..3 {
        let _ = router.clone().oneshot(read("flights", json!({}))).await;
    }
    assert_eq!(
        s.breaker_for("flights").state("flights"),
        CircuitState::Open
    );
    let res = router.oneshot(read("fx_rates", json!({}))).await;
    assert_eq!(res.unwrap().output, json!("ok"));
    assert_eq!(
        s.breaker_for("fx_rates").state("fx_rates"),
        CircuitState::Closed
    );
}

/// Failures made through different clones of a breaker layer, different services built
/// from it, and clones of those services, on several threads at once, all count for one
/// breaker per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn breaker_state_is_shared_by_every_clone_and_every_service_of_one_layer() {
    let layer = BreakerLayer::from_config(&BreakerConfig {
        consecutive_failures: 5,
        open_wait: Duration::from_secs(30),
        ..BreakerConfig::default()
    })
    .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let failing = {
        let calls = calls.clone();
        service_fn(move |_req: ToolRequest| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<ToolResponse, _>(unavailable()) }
        })
    };
    let a = layer.layer(failing.clone());
    let b = layer.clone().layer(failing.clone());
    let services = [a.clone(), b.clone(), a.clone(), b.clone(), a.clone()];
    let tasks: Vec<_> = services
        .into_iter()
        .map(|svc| tokio::spawn(svc.oneshot(ToolRequest::new("flights", json!({})))))
        .collect();
    for t in tasks {
        assert_eq!(
            t.await.unwrap().unwrap_err().kind(),
            ErrorKind::UpstreamUnavailable
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    // Every service of the layer, and a layer cloned before the failures, sees it open.
    let c = layer.clone().layer(failing);
    for svc in [a, b, c] {
        let err = svc
            .oneshot(ToolRequest::new("flights", json!({})))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5, "no call reached the tool");
}

#[tokio::test(start_paused = true)]
async fn breaker_state_is_shared_by_routers_of_a_cloned_shield() {
    let calls = Calls::new();
    let failing = tool(&calls, |_, _| async { Err(unavailable()) });
    let s = shield(EXECUTOR_SETTINGS);
    let first = router(&s, "flights", failing.clone());
    let second = router(&s.clone(), "flights", failing);
    // One failed call of two attempts through each, then one more attempt: 5 failures.
    let _ = first.clone().oneshot(read("flights", json!({}))).await;
    let _ = second.clone().oneshot(read("flights", json!({}))).await;
    let _ = first.clone().oneshot(read("flights", json!({}))).await;
    assert_eq!(calls.count(), 5);
    for r in [first, second] {
        let err = r.oneshot(read("flights", json!({}))).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    }
    assert_eq!(calls.count(), 5);
}

// ------------------------------------------------------------------ cache

#[tokio::test(start_paused = true)]
async fn identical_concurrent_misses_run_the_tool_once_and_all_get_its_answer() {
    let calls = Calls::new();
    let weather = tool(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(ToolResponse::new(json!({"temp": 72, "call": n})))
    });
    let router = router(&shield(EXECUTOR_SETTINGS), "weather", weather);

    // The same payload, its keys in both orders.
    let payloads = [
        json!({"city": "San Francisco", "date": "2025-01-15"}),
        serde_json::from_str::<Value>(r#"{"date": "2025-01-15", "city": "San Francisco"}"#)
            .unwrap(),
    ];
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let req = read("weather", payloads[i % 2].clone());
            tokio::spawn(router.clone().oneshot(req))
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap().expect("every caller gets the answer"));
    }
    assert_eq!(calls.count(), 1, "fifty identical misses, one tool call");
    assert!(answers
        .iter()
        .all(|a| a.output == json!({"temp": 72, "call": 1})));
    let fresh = answers.iter().filter(|a| !a.provenance.cache_hit).count();
    assert_eq!(
        fresh, 1,
        "only the caller whose call ran the tool has a fresh result"
    );
    let fetched: BTreeSet<_> = answers.iter().map(|a| a.provenance.fetched_at).collect();
    assert_eq!(fetched.len(), 1, "one fetch, one fetch time");

    // Later, the same payload is a hit; another value is another key.
    router
        .clone()
        .oneshot(read("weather", payloads[1].clone()))
        .await
        .unwrap();
    assert_eq!(calls.count(), 1);
    router
        .oneshot(read(
            "weather",
            json!({"city": "Paris", "date": "2025-01-15"}),
        ))
        .await
        .unwrap();
    assert_eq!(calls.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn concurrent_misses_that_fail_share_the_failure_and_cache_nothing() {
    let calls = Calls::new();
    let weather = tool(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if n == 1 {
            Err(ToolError::new(ErrorKind::ExecutionFailed, "tool bug"))
        } else {
            Ok(ToolResponse::new(json!({"call": n})))
        }
    });
    let router = router(&shield(EXECUTOR_SETTINGS), "weather", weather);
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            tokio::spawn(
                router
                    .clone()
                    .oneshot(read("weather", json!({"city": "Oslo"}))),
            )
        })
        .collect();
    for t in tasks {
        let err = t.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ExecutionFailed);
    }
    assert_eq!(
        calls.count(),
        1,
        "EXECUTION_FAILED is not retried, and ran once"
    );
    let res = router
        .oneshot(read("weather", json!({"city": "Oslo"})))
        .await
        .unwrap();
    assert_eq!(res.output, json!({"call": 2}), "the failure was not cached");
    assert!(!res.provenance.cache_hit);
}

// ------------------------------------------------------------------ provenance

#[tokio::test(start_paused = true)]
async fn results_carry_provenance_and_a_cache_hit_keeps_the_original_fetch() {
    let calls = Calls::new();
    let weather = tool(&calls, |_, _| async {
        Ok(ToolResponse::new(
            json!({"temp": 72, "conditions": "sunny"}),
        ))
    });
    let router = router(&shield(EXECUTOR_SETTINGS), "weather", weather);
    let payload = json!({"city": "San Francisco", "date": "2025-01-15"});

    let before = utc_at(Instant::now());
    let fresh = router
        .clone()
        .oneshot(
            read("weather", payload.clone())
                .trace_id("trace-123")
                .run_id("run-456"),
        )
        .await
        .unwrap();
    let after = utc_at(Instant::now());
    let p = &fresh.provenance;
    assert!(!p.cache_hit);
    assert_eq!(p.source.as_deref(), Some("weather"));
    assert_eq!(p.tool.as_deref(), Some("weather"));
    assert_eq!(p.attempts, 1);
    assert_eq!(p.trace_id.as_deref(), Some("trace-123"));
    let fetched_at = p.fetched_at.expect("a fresh result has its fetch time");
    assert!(before <= fetched_at && fetched_at <= after, "{fetched_at}");
    let digest = payload_digest(&fresh.output).unwrap();
    assert_eq!(
        p.response_digest,
        Some(digest),
        "SHA-256 of the canonical output"
    );

    tokio::time::advance(Duration::from_secs(600)).await;
    let hit = router
        .oneshot(read("weather", payload).trace_id("trace-789"))
        .await
        .unwrap();
    assert_eq!(calls.count(), 1);
    assert_eq!(hit.output, fresh.output);
    let h = &hit.provenance;
    assert!(h.cache_hit);
    assert_eq!(h.fetched_at, Some(fetched_at), "the original fetch time");
    assert!(utc_at(Instant::now()) > fetched_at, "ten minutes later");
    assert_eq!(h.response_digest, Some(digest));
    assert_eq!(h.source.as_deref(), Some("weather"));
    assert_eq!(
        h.trace_id.as_deref(),
        Some("trace-789"),
        "this caller's trace"
    );

    let envelope = serde_json::to_value(ToolResult::from(Ok::<_, ToolError>(hit))).unwrap();
    assert_eq!(envelope["status"], "success");
    assert_eq!(envelope["fromCache"], true);
    assert_eq!(envelope["provenance"]["cacheHit"], true);
    assert_eq!(envelope["data"], json!({"temp": 72, "conditions": "sunny"}));
}

// ------------------------------------------------------------------ soft timeout

/// Settings of a tool whose calls take 3 s: past the 2 s soft threshold, within the 4 s
/// hard timeout. One attempt per call; the default breaker (a count window of 100 calls,
/// 20 at least, opening when every call of it is slow).
const SLOW_SETTINGS: &str = r#"
[defaults]
kind = "read_only"
timeout = { attempt = "4s", soft = "2s" }
retry = { max_attempts = 1 }
"#;

/// A tool that answers after `slow` on the calls `is_slow(n)` picks, at once otherwise.
fn sometimes_slow(calls: &Calls, is_slow: fn(usize) -> bool) -> BoxTool {
    tool(calls, move |n, _| async move {
        if is_slow(n) {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Ok(ToolResponse::new(json!({"n": n})))
    })
}

#[tokio::test(start_paused = true)]
async fn a_window_of_slow_successes_opens_the_breaker_and_one_fast_call_keeps_it_closed() {
    // Every call slow: the 20th fills the window's minimum and opens the breaker.
    let calls = Calls::new();
    let s = shield(SLOW_SETTINGS);
    let slow = router(&s, "reports", sometimes_slow(&calls, |_| true));
    for i in 0..20 {
        let res = slow
            .clone()
            .oneshot(read("reports", json!({ "i": i })))
            .await
            .expect("a slow call is not a failure");
        assert!(
            res.provenance.slow,
            "call {i} took 3 s, past the 2 s soft timeout"
        );
    }
    let err = slow
        .oneshot(read("reports", json!({"i": 20})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen, "{err}");
    assert_eq!(calls.count(), 20);

    // One fast call among them: 95 % slow stays under the 100 % threshold.
    let calls = Calls::new();
    let s = shield(SLOW_SETTINGS);
    let mixed = router(&s, "reports", sometimes_slow(&calls, |n| n != 1));
    for i in 0..25 {
        let res = mixed
            .clone()
            .oneshot(read("reports", json!({ "i": i })))
            .await
            .expect("closed: every call reaches the tool");
        assert_eq!(res.provenance.slow, i != 0, "call {i}");
    }
    assert_eq!(
        s.breaker_for("reports").state("reports"),
        CircuitState::Closed
    );
}

// ------------------------------------------------------------------ metrics

/// The executor's settings for four tools: `weather` cached, `slow` past the soft
/// timeout, `hung` never answering (its breaker opens after 2 failures), `sleepy`
/// cancelled by its caller.
const METRICS_SETTINGS: &str = r#"
[defaults]
kind = "read_only"
timeout = { attempt = "4s", soft = "2s" }
retry = { max_attempts = 2, backoff = { strategy = "fixed", min = "200ms", max = "500ms" } }
breaker = { consecutive_failures = 5, open_wait = "30s" }

[tools.weather]
cache = { ttl = "1h" }

[tools.hung.breaker]
consecutive_failures = 2
open_wait = "30s"
"#;

#[tokio::test(start_paused = true)]
async fn every_outcome_is_counted_under_the_documented_names_labels_and_values() {
    let exporter = toolshield_metrics::local_prometheus();
    let s = shield(METRICS_SETTINGS).with_metrics(&exporter).unwrap();
    let calls = Calls::new();
    let router = s
        .router()
        .tool(
            "weather",
            tool(&calls, |_, _| async {
                Ok(ToolResponse::new(json!({"temp": 72})))
            }),
        )
        .tool("slow", sometimes_slow(&calls, |_| true))
        .tool("hung", tool(&calls, |_, _| std::future::pending()))
        .tool(
            "sleepy",
            tool(&calls, |_, _| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(ToolResponse::new(json!("late")))
            }),
        )
        .build()
        .unwrap();
    let call = |tool: &str| router.clone().oneshot(read(tool, json!({"city": "Paris"})));

    call("weather").await.unwrap();
    let hit = call("weather").await.unwrap();
    assert!(hit.provenance.cache_hit);
    assert!(call("slow").await.unwrap().provenance.slow);
    let started = Instant::now();
    assert_eq!(call("hung").await.unwrap_err().kind(), ErrorKind::Timeout);
    let hung_took = started.elapsed();
    assert_eq!(
        call("hung").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );
    let token = CancellationToken::new();
    let cancelled = tokio::spawn(
        router
            .clone()
            .oneshot(read("sleepy", json!({})).cancel_token(token.clone())),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    token.cancel();
    assert_eq!(
        cancelled.await.unwrap().unwrap_err().kind(),
        ErrorKind::Cancelled
    );

    let text = exporter.render();
    let exp = parse(&text).unwrap_or_else(|e| panic!("invalid exposition ({e}):\n{text}"));
    let value = |name: &str, labels: &[(&str, &str)]| exp.value(name, labels);
    let per_call = [
        ("weather", "success", 2.0, 0.0),
        ("slow", "success", 1.0, 3.0),
        ("hung", "timeout", 1.0, hung_took.as_secs_f64()),
        ("hung", "circuit_open", 1.0, 0.0),
        ("sleepy", "cancelled", 1.0, 1.0),
    ];
    for (tool, status, count, seconds) in per_call {
        let labels = [("tool", tool), ("status", status)];
        assert_eq!(
            value("tool_execution_total", &labels),
            Some(count),
            "{tool} {status}"
        );
        assert_eq!(
            value("tool_duration_seconds_count", &labels),
            Some(count),
            "{tool} {status}"
        );
        let sum = value("tool_duration_seconds_sum", &labels).expect("a duration sum");
        assert!(
            (sum - seconds).abs() < 1e-6,
            "{tool} {status}: {sum} s recorded, {seconds} s taken"
        );
    }
    for (tool, code) in [
        ("hung", "TIMEOUT"),
        ("hung", "CIRCUIT_OPEN"),
        ("sleepy", "CANCELLED"),
    ] {
        assert_eq!(
            value("tool_errors_total", &[("tool", tool), ("code", code)]),
            Some(1.0),
            "{tool} {code}"
        );
    }
    let error_tools = exp.label_values("tool_errors_total", "tool");
    assert!(
        !error_tools.contains("weather") && !error_tools.contains("slow"),
        "{error_tools:?}"
    );
    for (tool, outcome, count) in [
        ("weather", "success", 1.0),
        ("slow", "success", 1.0),
        ("hung", "timeout", 2.0),
        ("hung", "circuit_open", 1.0),
    ] {
        assert_eq!(
            value(
                "tool_attempts_total",
                &[("tool", tool), ("outcome", outcome)]
            ),
            Some(count),
            "{tool} {outcome}"
        );
    }
    assert_eq!(
        value(
            "tool_retries_total",
            &[("tool", "hung"), ("code", "TIMEOUT")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value("tool_cache_hits_total", &[("tool", "weather")]),
        Some(1.0)
    );
    assert_eq!(
        value("tool_cache_misses_total", &[("tool", "weather")]),
        Some(1.0)
    );
    assert_eq!(
        value("tool_slow_calls_total", &[("tool", "slow")]),
        Some(1.0)
    );
    assert!(
        !exp.label_values("tool_slow_calls_total", "tool")
            .contains("weather"),
        "a fast call is not slow"
    );
    assert_eq!(
        value(
            "circuit_breaker_state",
            &[("key", "hung"), ("state", "open")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value("circuit_breaker_rejections_total", &[("key", "hung")]),
        Some(1.0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_cache_hit_on_a_slow_result_is_neither_marked_nor_counted_slow() {
    let exporter = toolshield_metrics::local_prometheus();
    let s = shield(&format!(
        "{SLOW_SETTINGS}\n[tools.reports]\ncache = {{ ttl = \"1h\" }}\n"
    ))
    .with_metrics(&exporter)
    .unwrap();
    let calls = Calls::new();
    let router = router(&s, "reports", sometimes_slow(&calls, |_| true));
    let first = router
        .clone()
        .oneshot(read("reports", json!({"q": 1})))
        .await
        .unwrap();
    assert!(first.provenance.slow);
    let started = Instant::now();
    let hit = router
        .oneshot(read("reports", json!({"q": 1})))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(hit.provenance.cache_hit);
    assert!(!hit.provenance.slow, "answered at once from the cache");
    let exp = parse(&exporter.render()).unwrap();
    assert_eq!(
        exp.value("tool_slow_calls_total", &[("tool", "reports")]),
        Some(1.0),
        "one call crossed the soft timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn a_replay_of_a_slow_mutation_is_neither_marked_nor_counted_slow() {
    let exporter = toolshield_metrics::local_prometheus();
    let s = shield(
        "[defaults]\ntimeout = { attempt = \"4s\", soft = \"2s\" }\n[tools.pay]\nkind = \"mutating\"\n",
    )
    .with_metrics(&exporter)
    .unwrap();
    let calls = Calls::new();
    let router = router(&s, "pay", sometimes_slow(&calls, |_| true));
    let req = || ToolRequest::new("pay", json!({"amount": 5})).idempotency_key("order-1");
    let first = router.clone().oneshot(req()).await.unwrap();
    assert!(first.provenance.slow);
    let started = Instant::now();
    let replay = router.oneshot(req()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(replay.provenance.replayed);
    assert!(!replay.provenance.slow, "answered at once from the record");
    let exp = parse(&exporter.render()).unwrap();
    assert_eq!(
        exp.value("tool_slow_calls_total", &[("tool", "pay")]),
        Some(1.0),
        "one call crossed the soft timeout"
    );
}

// ------------------------------------------------------------------ configuration

#[test]
fn misconfigured_executor_settings_are_refused_at_load_with_every_problem() {
    // A jitter range with min > max, and a 60 s breaker window shorter than two 40 s
    // attempts: both reported at once, each with its path, before any call is made.
    let err = ShieldConfig::from_toml_str(
        r#"
[tools.weather]
kind = "read_only"
timeout = { attempt = "40s", soft = "2s" }
retry = { max_attempts = 2, backoff = { strategy = "fixed", min = "500ms", max = "200ms" } }
breaker = { window = { type = "time", duration = "60s", buckets = 12 } }
"#,
    )
    .and_then(Shield::from_config)
    .map(|_| ())
    .unwrap_err();
    let fields: Vec<&str> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert!(
        fields
            .iter()
            .any(|f| f.starts_with("tools.weather.retry.backoff")),
        "{err}"
    );
    assert!(
        fields
            .iter()
            .any(|f| f.starts_with("tools.weather.breaker.window")),
        "{err}"
    );
}
