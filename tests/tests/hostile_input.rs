//! Hostile input through the whole shield: durations at their extremes, tools that panic
//! in `call` or in their future, huge and empty names and keys, many distinct tool names,
//! and what errors reveal. DESIGN.md: never panic on input; REVIEW.md: bounds, panics,
//! exposure. (A `Value` nested ~3,000 deep overflows serde_json's own recursive `Drop` on
//! a debug test thread before the shield sees it, so `nested` stops at 1,000 levels, past
//! `canonical::MAX_DEPTH`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::HeaderValue;
use serde_json::{json, Value};
use toolshield::config::ShieldConfig;
use toolshield::shield::{BoxTool, Shield, ToolRouter};
use toolshield_core::config::MAX_DURATION;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolResult};
use toolshield_http::parse_retry_after;
use tower::{service_fn, Layer, Service, ServiceExt};

fn router(config: &str, name: &str, tool: BoxTool) -> ToolRouter {
    let shield =
        Shield::from_config(ShieldConfig::from_toml_str(config).expect("config")).expect("shield");
    shield.router().tool(name, tool).build().expect("router")
}

/// A tool whose `call` itself panics (not its future) on its first `panics_first` calls,
/// with the payload in the panic's text, then answers.
#[derive(Clone)]
struct PanicsInCall {
    calls: Arc<AtomicUsize>,
    panics_first: usize,
}

impl Service<ToolRequest> for PanicsInCall {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = std::future::Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.panics_first {
            panic!("tool blew up on {}", req.payload());
        }
        std::future::ready(Ok(ToolResponse::new(json!({"n": n}))))
    }
}

// ------------------------------------------------------------------ durations from peers

#[test]
fn retry_after_header_extremes_never_panic_and_stay_bounded() {
    let now = SystemTime::now();
    let cases: Vec<HeaderValue> = vec![
        HeaderValue::from_static("0"),
        HeaderValue::from_static("18446744073709551615"),
        HeaderValue::from_static("99999999999999999999999999999999999999"),
        HeaderValue::from_static("Fri, 31 Dec 9999 23:59:59 GMT"),
        HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"),
        HeaderValue::from_static("-1"),
        HeaderValue::from_static("1.5"),
        HeaderValue::from_bytes(b"\xff\xfe12").unwrap(),
        HeaderValue::from_bytes(&vec![b'9'; 64 * 1024]).unwrap(),
    ];
    for v in &cases {
        if let Some(d) = parse_retry_after(v, now) {
            assert!(d <= MAX_DURATION, "{v:?} -> {d:?}");
        }
    }
    // A date in the past from a clock far ahead, and `now` at the epoch.
    let far = SystemTime::UNIX_EPOCH + Duration::from_secs(400 * 365 * 86_400);
    let _ = parse_retry_after(
        &HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        far,
    );
    let _ = parse_retry_after(
        &HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        SystemTime::UNIX_EPOCH,
    );
}

#[tokio::test(start_paused = true)]
async fn a_tool_error_with_retry_after_of_duration_max_never_panics_the_stack() {
    let config = "[defaults]\nkind = \"read_only\"\n\
                  retry = { max_attempts = 3, max_retry_after = \"366d\" }\n";
    for wait in [
        Duration::MAX,
        MAX_DURATION,
        Duration::ZERO,
        Duration::from_nanos(1),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let tool = BoxTool::new(service_fn(move |_req: ToolRequest| {
            c.fetch_add(1, Ordering::SeqCst);
            async move { Err::<ToolResponse, _>(ToolError::rate_limited("slow down", Some(wait))) }
        }));
        let r = router(config, "t", tool);
        let result = r.oneshot(ToolRequest::new("t", json!({}))).await;
        let err = result.as_ref().expect_err("fails").clone();
        assert_eq!(err.kind(), ErrorKind::RateLimited, "{wait:?}");
        let _ = err.for_model("t");
        let envelope = ToolResult::from(result);
        serde_json::to_string(&envelope).expect("serializes");
    }
}

// ------------------------------------------------------------------ builders at extremes

#[tokio::test(start_paused = true)]
async fn layers_built_with_duration_max_never_panic_on_a_call() {
    use toolshield::cache::{CacheConfig, CacheLayer};
    use toolshield::hedge::{HedgeDelay, HedgeLayer};
    use toolshield::ratelimit::{RateLimit, RateLimitLayer};
    use toolshield::timeout::{DeadlineLayer, TimeoutLayer};

    let answers = || {
        service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!(1))) })
    };
    let req = || ToolRequest::new("t", json!({"a": 1})).kind(CallKind::ReadOnly);

    let mut svc = TimeoutLayer::new(Duration::MAX)
        .soft_threshold(Duration::MAX)
        .idle(Duration::MAX)
        .layer(answers());
    assert!(svc.ready().await.unwrap().call(req()).await.is_ok());

    let mut svc = DeadlineLayer::new(Duration::MAX).layer(answers());
    assert!(svc.ready().await.unwrap().call(req()).await.is_ok());

    let mut svc = toolshield_retry::RetryLayer::new(u32::MAX)
        .with_max_retry_after(Duration::MAX)
        .with_min_attempt_time(Duration::MAX)
        .layer(answers());
    assert!(svc.ready().await.unwrap().call(req()).await.is_ok());

    if let Ok(layer) = CacheLayer::new(
        CacheConfig::default()
            .with_ttl(Duration::MAX)
            .with_stale_if_error(Duration::MAX),
    ) {
        let mut svc = layer.layer(answers());
        assert!(svc.ready().await.unwrap().call(req()).await.is_ok());
        assert!(svc.ready().await.unwrap().call(req()).await.is_ok());
    }

    let mut svc = HedgeLayer::new(HedgeDelay::fixed(Duration::MAX), u32::MAX).layer(answers());
    assert!(svc.ready().await.unwrap().call(req()).await.is_ok());
    let mut svc = HedgeLayer::new(
        HedgeDelay::percentile(f64::NAN, Duration::MAX, Duration::ZERO),
        1,
    )
    .layer(answers());
    assert!(svc.ready().await.unwrap().call(req()).await.is_ok());

    let mut svc = RateLimitLayer::new(RateLimit::new(0, Duration::MAX, u32::MAX))
        .wait_up_to(Duration::MAX)
        .layer(answers());
    for _ in 0..3 {
        let _ = svc.ready().await.unwrap().call(req()).await;
    }
    let mut svc = RateLimitLayer::new(RateLimit::new(1, Duration::MAX, 1))
        .wait_up_to(Duration::MAX)
        .layer(answers());
    assert!(svc.ready().await.unwrap().call(req()).await.is_ok());
    // The second waits (up to 366 days, bounded): it must not panic, and it is cut here.
    let second = svc.ready().await.unwrap().call(req());
    let _ = tokio::time::timeout(Duration::from_secs(1), second).await;

    let mut svc = toolshield::bulkhead::BulkheadLayer::new(usize::MAX)
        .with_queue(usize::MAX, Duration::MAX)
        .layer(answers());
    assert!(svc.ready().await.unwrap().call(req()).await.is_ok());
}

// ------------------------------------------------------------------ panics in `call`

/// DESIGN.md: "a tool panics: caught inside the stack: INTERNAL, counted by the breaker,
/// not retried". A tool's `call` (not only its future) may panic.
#[tokio::test(start_paused = true)]
async fn a_tool_panicking_in_call_becomes_internal_and_frees_the_bulkhead() {
    let config = "[defaults]\nkind = \"read_only\"\n\
                  [tools.t]\nbulkhead = { max_concurrent = 1, max_queue = 0 }\n";
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = BoxTool::new(PanicsInCall {
        calls: Arc::clone(&calls),
        panics_first: 3,
    });
    let r = router(config, "t", tool);
    for i in 0..3 {
        let err = r
            .clone()
            .oneshot(ToolRequest::new("t", json!({"secret": "sk-123"})))
            .await
            .expect_err("the tool panicked");
        assert_eq!(err.kind(), ErrorKind::Internal, "call {i}");
        assert!(!err.message().contains("sk-123"), "{err:?}");
        assert!(!err.for_model("t").contains("sk-123"));
    }
    let ok = r.clone().oneshot(ToolRequest::new("t", json!({}))).await;
    assert!(
        ok.is_ok(),
        "the bulkhead permit and breaker came back: {ok:?}"
    );
}

/// A mutation that panics in `call` must not leave its idempotency key PENDING forever:
/// docs/idempotency.md: INTERNAL after an attempt reached the tool -> FAILED
/// OUTCOME_UNKNOWN.
#[tokio::test(start_paused = true)]
async fn a_mutation_panicking_in_call_ends_outcome_unknown_not_pending() {
    let config = "[defaults]\nkind = \"mutating\"\n";
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = BoxTool::new(PanicsInCall {
        calls: Arc::clone(&calls),
        panics_first: 1,
    });
    let r = router(config, "pay", tool);
    let req = || ToolRequest::new("pay", json!({"amount": 5})).idempotency_key("order-1");
    let first = r.clone().oneshot(req()).await.expect_err("panicked");
    assert!(
        matches!(
            first.kind(),
            ErrorKind::Internal | ErrorKind::OutcomeUnknown
        ),
        "{first:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = r.clone().oneshot(req()).await;
    let e = second.expect_err("the key's outcome is unknown");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never run twice");
}

/// The half-open probe's permit comes back when the probe panics.
#[tokio::test(start_paused = true)]
async fn a_panicking_half_open_probe_frees_its_permit() {
    let config = "[defaults]\nkind = \"read_only\"\nretry = { max_attempts = 1 }\n\
                  breaker = { consecutive_failures = 1, open_wait = \"1s\" }\n";
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = BoxTool::new(PanicsInCall {
        calls: Arc::clone(&calls),
        panics_first: 2,
    });
    let r = router(config, "t", tool);
    let req = || ToolRequest::new("t", json!({}));
    // Opens.
    assert_eq!(
        r.clone().oneshot(req()).await.unwrap_err().kind(),
        ErrorKind::Internal
    );
    assert_eq!(
        r.clone().oneshot(req()).await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The probe panics: re-opens.
    assert_eq!(
        r.clone().oneshot(req()).await.unwrap_err().kind(),
        ErrorKind::Internal
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    // Another probe is let through, and succeeds.
    let ok = r.clone().oneshot(req()).await;
    assert!(ok.is_ok(), "{ok:?}");
}

// ------------------------------------------------------------------ names, keys, nesting

#[tokio::test(start_paused = true)]
async fn huge_and_empty_tool_names_and_keys_never_panic_and_are_not_echoed_whole() {
    let config = "[defaults]\nkind = \"mutating\"\n";
    let tool = BoxTool::new(service_fn(|_req: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!(1)))
    }));
    let r = router(config, "t", tool);
    let huge = "x".repeat(1 << 20);
    let names = [
        String::new(),
        " ".into(),
        huge.clone(),
        "t\u{0}\n".into(),
        "a__".into(),
    ];
    for name in names {
        let res = r
            .clone()
            .oneshot(ToolRequest::new(name.as_str(), json!({})))
            .await;
        let e = res.expect_err("no such tool");
        assert!(
            e.message().len() < 4096,
            "message of {} bytes",
            e.message().len()
        );
        assert!(e.for_model(&name).len() < 4096);
        serde_json::to_string(&ToolResult::from(Err::<ToolResponse, _>(e))).unwrap();
    }
    for key in [
        "".to_owned(),
        "   ".to_owned(),
        huge.clone(),
        "k\u{0}\r\n".to_owned(),
    ] {
        let res = r
            .clone()
            .oneshot(ToolRequest::new("t", json!({"n": 1})).idempotency_key(key.as_str()))
            .await;
        if let Err(e) = res {
            assert!(
                e.message().len() < 4096,
                "message of {} bytes",
                e.message().len()
            );
        }
    }
    let res = r
        .clone()
        .oneshot(
            ToolRequest::new("t", json!({}))
                .caller(huge.as_str())
                .idempotency_key("k"),
        )
        .await;
    if let Err(e) = res {
        assert!(e.message().len() < 4096);
    }
}

fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = json!([v]);
    }
    v
}

#[tokio::test(start_paused = true)]
async fn deeply_nested_payloads_are_refused_not_a_crash() {
    let config = "[defaults]\nkind = \"read_only\"\n[tools.t]\ncache = { ttl = \"1m\" }\n\
                  [tools.m]\nkind = \"mutating\"\n";
    let tool = || {
        BoxTool::new(service_fn(|_req: ToolRequest| async {
            Ok::<_, ToolError>(ToolResponse::new(json!(1)))
        }))
    };
    let shield =
        Shield::from_config(ShieldConfig::from_toml_str(config).expect("config")).expect("shield");
    let r = shield
        .router()
        .tool("t", tool())
        .tool("m", tool())
        .build()
        .unwrap();
    // A mutation needs the digest for its idempotency key: refused.
    let res = r.clone().oneshot(ToolRequest::new("m", nested(1000))).await;
    let e = res.expect_err("a mutation without a canonical form is refused");
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e:?}");
    // The cache, an optimisation, passes the read-only call to the tool uncached.
    let res = r.clone().oneshot(ToolRequest::new("t", nested(1000))).await;
    assert!(res.is_ok(), "{res:?}");
}

/// docs/idempotency.md: `INTERNAL` of an `Idempotent` call releases the key (running it
/// again is harmless): a panic must not leave it PENDING.
#[tokio::test(start_paused = true)]
async fn an_idempotent_call_panicking_in_call_releases_its_key() {
    let config = "[defaults]\nkind = \"idempotent\"\nretry = { max_attempts = 1 }\n";
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = BoxTool::new(PanicsInCall {
        calls: Arc::clone(&calls),
        panics_first: 1,
    });
    let r = router(config, "put", tool);
    let req = || ToolRequest::new("put", json!({"v": 1})).idempotency_key("k-1");
    let first = r.clone().oneshot(req()).await.expect_err("panicked");
    assert_eq!(first.kind(), ErrorKind::Internal, "{first:?}");
    let second = r.clone().oneshot(req()).await;
    assert!(second.is_ok(), "the key was released: {second:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// DESIGN.md section 5 and docs/configuration.md: breakers are bounded by `max_keys`,
/// and the `tool` and `key` labels are bounded, whatever names a model sends behind
/// `server__*`.
#[tokio::test(start_paused = true)]
async fn many_model_chosen_server_tool_names_stay_bounded() {
    let config = "[defaults]\nkind = \"read_only\"\nretry = { max_attempts = 1 }\n\
                  breaker = { max_keys = 50 }\n[tools.srv]\nkind = \"read_only\"\n";
    let exporter = toolshield::metrics::local_prometheus();
    let shield = Shield::from_config(ShieldConfig::from_toml_str(config).expect("config"))
        .expect("shield")
        .with_metrics(&exporter)
        .expect("metrics");
    let tool = BoxTool::new(service_fn(|_req: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!(1)))
    }));
    let r = shield.router().server("srv", tool).build().unwrap();
    for i in 0..3000 {
        let name = format!("srv__tool{i}");
        let res = r
            .clone()
            .oneshot(ToolRequest::new(name.as_str(), json!({})))
            .await;
        assert!(res.is_ok(), "{name}: {res:?}");
        let _ = r
            .clone()
            .oneshot(ToolRequest::new(format!("nosuch{i}").as_str(), json!({})))
            .await;
    }
    let held: usize = shield.breakers().values().map(|b| b.len()).sum();
    assert!(held <= 50, "{held} breakers held");
    let text = exporter.render();
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    assert!(series < 2000, "{series} series");
    assert!(
        !text.contains("nosuch"),
        "an unregistered name became a label"
    );
}

/// A tool whose future panics after `after` on its first call, and answers afterwards.
fn panics_once_in_future(calls: &Arc<AtomicUsize>, after: Duration) -> BoxTool {
    let calls = Arc::clone(calls);
    BoxTool::new(service_fn(move |_req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(after).await;
            if n == 0 {
                panic!("boom");
            }
            Ok::<_, ToolError>(ToolResponse::new(json!({"n": n})))
        }
    }))
}

/// REVIEW.md: "A tool that panics: does anything ... leave a PENDING record forever?" A
/// cache layer used on its own (no catch-panic below it): the leader's panic unwinds its
/// task; a follower of the same key must not wait forever.
#[tokio::test(start_paused = true)]
async fn a_cache_follower_is_not_stranded_when_the_leader_panics() {
    use toolshield::cache::{CacheConfig, CacheLayer};
    let calls = Arc::new(AtomicUsize::new(0));
    let layer =
        CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(60))).expect("layer");
    let svc = layer.layer(panics_once_in_future(&calls, Duration::from_millis(10)));
    let req = || ToolRequest::new("t", json!({"q": 1})).kind(CallKind::ReadOnly);
    let leader = tokio::spawn(svc.clone().oneshot(req()));
    tokio::task::yield_now().await;
    let follower = tokio::spawn(svc.clone().oneshot(req()));
    assert!(leader.await.is_err(), "the leader's task panicked");
    let out = tokio::time::timeout(Duration::from_secs(30), follower)
        .await
        .expect("the follower finished")
        .expect("no panic in the follower");
    let _ = out;
}

/// The same for the idempotency layer on its own: a mutation whose future panics leaves
/// no PENDING record forever; a duplicate is told OUTCOME_UNKNOWN (docs/idempotency.md,
/// "A call future dropped ... a Mutating call already sent: FAILED OUTCOME_UNKNOWN").
#[tokio::test(start_paused = true)]
async fn an_idempotency_duplicate_is_not_stranded_when_the_owner_panics() {
    use toolshield::idempotency::{IdempotencyConfig, IdempotencyLayer};
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(IdempotencyConfig::default()).expect("layer");
    let svc = layer.layer(panics_once_in_future(&calls, Duration::from_millis(10)));
    let req = || {
        ToolRequest::new("pay", json!({"amount": 1}))
            .kind(CallKind::Mutating)
            .idempotency_key("order-9")
    };
    let owner = tokio::spawn(svc.clone().oneshot(req()));
    tokio::task::yield_now().await;
    let duplicate = tokio::spawn(svc.clone().oneshot(req()));
    assert!(owner.await.is_err(), "the owner's task panicked");
    let out = tokio::time::timeout(Duration::from_secs(60), duplicate)
        .await
        .expect("the duplicate finished")
        .expect("no panic in the duplicate");
    let e = out.expect_err("the outcome is unknown");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never run twice");
}
