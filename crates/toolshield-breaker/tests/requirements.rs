//! The circuit-breaker requirements a user relies on, through the public API on tokio's
//! paused clock: which error kinds count, the lazy open to half-open move, the minimum
//! number of calls for both rates, manual overrides held across time, clones and
//! eviction, keys chosen by a caller kept apart and bounded, and the JSON-lines event log
//! for any key.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_breaker::{
    key_fn, BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState, WindowConfig,
};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{BoxedTool, FailOnPayload};
use tower::{service_fn, Layer, Service, ServiceExt};

mod support;

use support::{call, calls, req, setup, Tool};

/// The kinds `docs/breaker.md` lists as breaker failures; every other kind is ignored.
const COUNTED: [ErrorKind; 6] = [
    ErrorKind::Timeout,
    ErrorKind::RateLimited,
    ErrorKind::Unauthorized,
    ErrorKind::ConnectionFailed,
    ErrorKind::UpstreamUnavailable,
    ErrorKind::ExecutionFailed,
];

#[tokio::test(start_paused = true)]
async fn every_error_kind_counts_for_the_breaker_exactly_as_documented() {
    for kind in ErrorKind::ALL {
        let layer = BreakerLayer::from_config(&BreakerConfig {
            consecutive_failures: 1,
            window: WindowConfig::count(10),
            min_calls: 1,
            failure_rate: 1.0,
            ..BreakerConfig::default()
        })
        .unwrap();
        let registry = layer.registry().clone();
        let mut svc = layer.layer(service_fn(move |_req: ToolRequest| async move {
            Err::<ToolResponse, _>(ToolError::new(kind, "it failed"))
        }));
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(ToolRequest::new("llm", json!({})))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind, "the tool's error goes back unchanged");
        let status = registry.status("llm").expect("the key's breaker exists");
        if COUNTED.contains(&kind) {
            assert_eq!(status.state, CircuitState::Open, "{kind} is a failure");
        } else {
            assert_eq!(
                (
                    status.state,
                    status.calls_in_window,
                    status.consecutive_failures
                ),
                (CircuitState::Closed, 0, 0),
                "{kind} is neither a failure nor a success"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_wait_ending_moves_nothing_until_the_next_call() {
    let (mut svc, registry, tool) = setup(BreakerConfig::default());
    let mut rx = registry.subscribe();
    calls(&mut svc, "t", "fail", 5).await;
    assert_eq!(rx.try_recv().unwrap().to, CircuitState::Open);
    advance(Duration::from_secs(3600)).await;
    for _ in 0..3 {
        let s = registry.status("t").unwrap();
        assert_eq!(s.state, CircuitState::Open, "reading never changes state");
        assert_eq!(s.time_until_half_open, Some(Duration::ZERO));
    }
    assert!(rx.try_recv().is_err(), "no timer moved it to half-open");
    let before = tool.calls.load(Ordering::SeqCst);
    call(&mut svc, "t", "ok")
        .await
        .expect("the probe is admitted");
    assert_eq!(tool.calls.load(Ordering::SeqCst), before + 1);
    let moves: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
        .map(|e| (e.from, e.to))
        .collect();
    assert_eq!(
        moves,
        [
            (CircuitState::Open, CircuitState::HalfOpen),
            (CircuitState::HalfOpen, CircuitState::Closed)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_slow_call_rate_waits_for_the_minimum_number_of_calls_too() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 0,
        window: WindowConfig::count(10),
        min_calls: 4,
        slow_call_rate: Some(50.0),
        ..BreakerConfig::default()
    });
    calls(&mut svc, "t", "slow", 3).await;
    let s = registry.status("t").unwrap();
    assert_eq!((s.state, s.slow_calls_in_window), (CircuitState::Closed, 3));
    calls(&mut svc, "t", "slow", 1).await;
    assert_eq!(registry.state("t"), CircuitState::Open, "4 of 4 slow");
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_shows_the_rates_that_opened_it_and_a_close_clears_them() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 0,
        window: WindowConfig::count(10),
        min_calls: 4,
        failure_rate: 50.0,
        ..BreakerConfig::default()
    });
    calls(&mut svc, "t", "ok", 2).await;
    calls(&mut svc, "t", "fail", 2).await;
    let s = registry.status("t").unwrap();
    assert_eq!(s.state, CircuitState::Open);
    assert_eq!((s.calls_in_window, s.failures_in_window), (4, 2));
    assert!((s.failure_rate - 50.0).abs() < 1e-9, "{}", s.failure_rate);
    advance(Duration::from_secs(30)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    let s = registry.status("t").unwrap();
    assert_eq!(
        (s.state, s.calls_in_window, s.failures_in_window),
        (CircuitState::Closed, 0, 0)
    );
}

/// Three handles on one breaker: a service, its clone, and a service built separately
/// from a clone of the layer.
fn three_services(config: BreakerConfig) -> ([support::Svc; 3], BreakerRegistry, Tool) {
    let layer = BreakerLayer::from_config(&config).unwrap();
    let registry = layer.registry().clone();
    let tool = Tool::default();
    let a = layer.layer(tool.clone());
    let b = a.clone();
    let c = layer.clone().layer(tool.clone());
    ([a, b, c], registry, tool)
}

#[tokio::test(start_paused = true)]
async fn a_forced_open_key_rejects_on_every_clone_for_as_long_as_it_is_held() {
    let (mut svcs, registry, tool) = three_services(BreakerConfig {
        max_keys: 8,
        idle_ttl: Duration::from_secs(1),
        ..BreakerConfig::default()
    });
    for svc in &mut svcs {
        call(svc, "builder", "ok").await.unwrap(); // each caches the breaker
    }
    registry.force_open("builder");
    let before = tool.calls.load(Ordering::SeqCst);
    for hour in 0..48 {
        advance(Duration::from_secs(3600)).await;
        // A flood of other keys and explicit sweeps: the override is never evicted.
        for i in 0..20 {
            call(&mut svcs[0], &format!("other-{hour}-{i}"), "ok")
                .await
                .unwrap();
        }
        registry.evict_idle();
        registry.evict_idle();
        for svc in &mut svcs {
            let err = call(svc, "builder", "ok").await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::CircuitOpen, "hour {hour}");
            assert_eq!(err.retry_after(), None, "a held override has no end");
        }
        assert_eq!(registry.state("builder"), CircuitState::ForcedOpen);
    }
    assert_eq!(
        tool.calls.load(Ordering::SeqCst) - before,
        48 * 20,
        "only the other keys reached the tool"
    );

    registry.reset("builder");
    for svc in &mut svcs {
        call(svc, "builder", "ok").await.expect("released");
    }
    assert_eq!(registry.state("builder"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_forced_closed_key_never_trips_until_released_and_then_trips_again() {
    let (mut svcs, registry, _) = three_services(BreakerConfig::default());
    calls(&mut svcs[0], "janitor", "fail", 5).await;
    assert_eq!(registry.state("janitor"), CircuitState::Open);
    registry.force_closed("janitor");
    for round in 0..10 {
        for svc in &mut svcs {
            let err = call(svc, "janitor", "fail").await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable, "round {round}");
        }
        advance(Duration::from_secs(600)).await;
        registry.evict_idle();
    }
    let s = registry.status("janitor").unwrap();
    assert_eq!(s.state, CircuitState::Disabled);
    assert_eq!(s.consecutive_failures, 30, "still recorded");

    registry.reset("janitor");
    calls(&mut svcs[1], "janitor", "fail", 4).await;
    assert_eq!(
        registry.state("janitor"),
        CircuitState::Closed,
        "fresh count"
    );
    calls(&mut svcs[2], "janitor", "fail", 1).await;
    assert_eq!(registry.state("janitor"), CircuitState::Open);
    let err = call(&mut svcs[0], "janitor", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
}

#[tokio::test(start_paused = true)]
async fn an_override_after_eviction_reaches_services_that_cached_the_evicted_breaker() {
    let (mut svcs, registry, tool) = three_services(BreakerConfig::default());
    for svc in &mut svcs {
        call(svc, "oracle", "ok").await.unwrap();
    }
    registry.evict_idle();
    registry.evict_idle();
    assert!(registry.status("oracle").is_none(), "idle breaker evicted");
    registry.force_open("oracle");
    let before = tool.calls.load(Ordering::SeqCst);
    for svc in &mut svcs {
        let err = call(svc, "oracle", "ok").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    }
    assert_eq!(tool.calls.load(Ordering::SeqCst), before);
    assert_eq!(registry.status("oracle").unwrap().rejections, 3);
}

#[tokio::test(start_paused = true)]
async fn closing_all_holds_even_against_a_probe_that_fails_afterwards() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    for key in ["builder", "janitor", "scout"] {
        calls(&mut svc, key, "fail", 5).await;
    }
    advance(Duration::from_secs(30)).await;
    // A probe of "scout" is in flight when the operator closes every breaker.
    let probe = tokio::spawn(svc.ready().await.unwrap().call(req("scout", "sleep_fail")));
    tokio::task::yield_now().await;
    assert_eq!(registry.state("scout"), CircuitState::HalfOpen);
    registry.force_closed_all();
    assert_eq!(
        probe.await.unwrap().unwrap_err().kind(),
        ErrorKind::UpstreamUnavailable
    );
    for key in ["builder", "janitor", "scout"] {
        assert_eq!(registry.state(key), CircuitState::Disabled, "{key}");
        call(&mut svc, key, "ok").await.expect("admitted");
    }

    // The same with reset: the failed probe belongs to the phase the reset ended.
    calls(&mut svc, "designer", "fail", 5).await;
    advance(Duration::from_secs(30)).await;
    let probe = tokio::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(req("designer", "sleep_fail")),
    );
    tokio::task::yield_now().await;
    registry.reset_all();
    let _ = probe.await.unwrap();
    let s = registry.status("designer").unwrap();
    assert_eq!(
        (s.state, s.consecutive_failures, s.calls_in_window),
        (CircuitState::Closed, 0, 0)
    );
}

/// Keys a caller may pick that look alike: every one of length `len` that differs from
/// `base` in one byte, in length, or by a trailing NUL.
fn neighbours(base: &str) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..base.len() {
        let mut bytes = base.as_bytes().to_vec();
        bytes[i] = if bytes[i] == b'z' { b'y' } else { b'z' };
        out.push(String::from_utf8(bytes).unwrap());
    }
    out.push(format!("{base}z"));
    out.push(format!("{base}\0"));
    out.push(format!("z{base}"));
    if !base.is_empty() {
        out.push(base[..base.len() - 1].to_owned());
        out.push(base[1..].to_owned());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn keys_that_differ_in_one_byte_or_in_length_have_breakers_of_their_own() {
    for len in 0..=40usize {
        let base: String = (0..len)
            .map(|i| char::from(b'a' + (i % 25) as u8))
            .collect();
        let layer = BreakerLayer::from_config(&BreakerConfig {
            consecutive_failures: 1,
            ..BreakerConfig::default()
        })
        .unwrap()
        .key_fn(key_fn(|r: &ToolRequest| {
            Cow::Owned(r.payload()["host"].as_str().unwrap_or("-").to_owned())
        }));
        let registry = layer.registry().clone();
        let mut svc =
            BoxedTool::new(layer.layer(FailOnPayload::new("r", ErrorKind::UpstreamUnavailable)));
        let on = |host: &str, r: &str| ToolRequest::new("fetch", json!({ "host": host, "r": r }));
        let _ = toolshield_test::call(&mut svc, on(&base, "fail")).await;
        assert_eq!(registry.state(&base), CircuitState::Open);
        for other in neighbours(&base) {
            // The service holds `base`'s breaker from its last call: `other` must not
            // be taken for it.
            toolshield_test::call(&mut svc, on(&other, "ok"))
                .await
                .unwrap_or_else(|e| panic!("{other:?} rejected for {base:?}'s breaker: {e}"));
            assert_eq!(registry.state(&other), CircuitState::Closed);
            let err = toolshield_test::call(&mut svc, on(&base, "ok"))
                .await
                .unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::CircuitOpen,
                "{base:?} after {other:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn reading_the_state_of_unknown_keys_creates_no_breaker() {
    let registry = BreakerRegistry::new(BreakerConfig {
        max_keys: 10,
        ..BreakerConfig::default()
    })
    .unwrap();
    for i in 0..100_000 {
        let key = format!("agent-{i}");
        assert_eq!(registry.state(&key), CircuitState::Closed);
        assert!(registry.status(&key).is_none());
        assert_eq!(registry.rejections(&key), 0);
    }
    assert_eq!(registry.len(), 0);
    assert!(registry.status_all().is_empty());
}

/// 250 times `max_keys` distinct keys, each failing once (so each opens, and only a wait
/// and a sweep free it). The bound does not depend on the count: the same run with
/// 1,000,000 keys passes too, in about 40 s of a debug build.
#[tokio::test(start_paused = true)]
async fn a_flood_of_distinct_keys_leaves_at_most_max_keys_breakers_and_their_counts() {
    const MAX: usize = 1_000;
    let layer = BreakerLayer::from_config(&BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(1),
        idle_ttl: Duration::from_secs(1),
        max_keys: MAX,
        ..BreakerConfig::default()
    })
    .unwrap();
    let registry = layer.registry().clone();
    let events = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&events);
    registry.on_event(move |_| {
        seen.fetch_add(1, Ordering::Relaxed);
    });
    let mut svc = layer.layer(service_fn(|_req: ToolRequest| {
        std::future::ready(Err::<ToolResponse, _>(ToolError::new(
            ErrorKind::UpstreamUnavailable,
            "down",
        )))
    }));
    let mut key = String::new();
    for i in 0..250_000u32 {
        key.clear();
        key.push_str("server__");
        key.push_str(&i.to_string());
        let res = toolshield_test::call_now(
            &mut svc,
            ToolRequest::new(key.as_str(), serde_json::Value::Null),
        );
        assert_eq!(res.unwrap_err().kind(), ErrorKind::UpstreamUnavailable);
        if i % 500 == 499 {
            advance(Duration::from_secs(1)).await;
        }
        if i % 50_000 == 49_999 {
            assert!(
                registry.len() <= MAX,
                "{} breakers at key {i}",
                registry.len()
            );
            assert!(registry.status_all().len() <= MAX);
            let counts = registry.transition_counts();
            let mut keys: Vec<&str> = counts.iter().map(|c| &*c.key).collect();
            keys.sort_unstable();
            keys.dedup();
            assert!(keys.len() <= MAX, "counts kept for {} keys", keys.len());
        }
    }
    drop(svc);
    let held: u64 = registry.transition_counts().iter().map(|c| c.count).sum();
    let gone: u64 = registry
        .evicted_counts()
        .transitions
        .iter()
        .map(|t| t.2)
        .sum();
    assert_eq!(held + gone, events.load(Ordering::Relaxed), "no count lost");
    assert!(
        events.load(Ordering::Relaxed) > 225_000,
        "most keys were held and opened: {}",
        events.load(Ordering::Relaxed)
    );
}

/// Characters some readers end a line on: `\n`, `\r`, vertical tab, form feed, the
/// information separators, NEL and the Unicode line and paragraph separators (Python's
/// `str.splitlines`, JavaScript before ES2019, many log viewers).
fn ends_a_line_somewhere(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{1c}'
            ..='\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

const KEYS: [&str; 12] = [
    "weather",
    "\"},{\"key\":\"forged\",\"to\":\"closed",
    "back\\slash\\",
    "new\nline",
    "carriage\rreturn",
    "nul\0byte",
    "esc\u{1b}[2J",
    "del\u{7f}",
    "nel\u{85}next",
    "line\u{2028}separator",
    "para\u{2029}graph",
    "émoji 🦀 \u{feff}",
];

#[tokio::test(start_paused = true)]
async fn each_event_is_one_json_line_that_gives_back_its_key() {
    let path = std::env::temp_dir().join(format!(
        "toolshield-breaker-requirements-{}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let long = "k\u{2028}".repeat(toolshield_breaker::MAX_KEY_LEN / 4);
    let mut keys: Vec<String> = KEYS.iter().map(|k| (*k).to_owned()).collect();
    keys.push(long);
    let layer = BreakerLayer::from_config(&BreakerConfig {
        consecutive_failures: 1,
        events_file: Some(path.clone()),
        ..BreakerConfig::default()
    })
    .unwrap()
    .key_fn(key_fn(|r: &ToolRequest| {
        Cow::Owned(r.payload()["host"].as_str().unwrap_or("-").to_owned())
    }));
    let registry = layer.registry().clone();
    let mut svc =
        BoxedTool::new(layer.layer(FailOnPayload::new("r", ErrorKind::UpstreamUnavailable)));
    for key in &keys {
        let request = ToolRequest::new("fetch", json!({ "host": key, "r": "fail" }));
        let _ = toolshield_test::call(&mut svc, request).await;
        registry.force_open(key);
        registry.reset(key);
    }
    registry.flush_event_log();
    assert_eq!(registry.event_log_dropped(), 0);
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);

    let lines: Vec<&str> = text.split_terminator('\n').collect();
    assert_eq!(lines.len(), keys.len() * 3, "three events per key:\n{text}");
    for (i, line) in lines.iter().enumerate() {
        assert!(
            !line.chars().any(ends_a_line_somewhere),
            "line {i} holds a line break: {line:?}"
        );
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("line {i} is not JSON: {e}"));
        let object = event.as_object().unwrap();
        assert_eq!(object.len(), 6, "{line}");
        assert_eq!(event["key"].as_str(), Some(keys[i / 3].as_str()));
        let (from, to) = [
            ("closed", "open"),
            ("open", "forced_open"),
            ("forced_open", "closed"),
        ][i % 3];
        assert_eq!(
            (event["from"].as_str(), event["to"].as_str()),
            (Some(from), Some(to))
        );
    }
}

#[tokio::test(start_paused = true)]
async fn rejections_and_probes_count_once_per_call_on_a_shared_breaker() {
    let (mut svcs, registry, tool) = three_services(BreakerConfig::default());
    calls(&mut svcs[0], "anthropic", "fail", 5).await;
    let base = tool.calls.load(Ordering::SeqCst);
    for svc in &mut svcs {
        for _ in 0..4 {
            assert_eq!(
                call(svc, "anthropic", "ok").await.unwrap_err().kind(),
                ErrorKind::CircuitOpen
            );
        }
    }
    assert_eq!(registry.rejections("anthropic"), 12);
    assert_eq!(tool.calls.load(Ordering::SeqCst), base);
    // The other provider is untouched.
    for svc in &mut svcs {
        call(svc, "openai", "ok").await.unwrap();
    }
    assert_eq!(registry.rejections("openai"), 0);
    assert_eq!(registry.state("openai"), CircuitState::Closed);
}
