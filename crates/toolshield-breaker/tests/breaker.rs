//! Behaviour of the breaker with tokio's paused clock: transitions, trips, windows,
//! probes, classification, manual control, sharing, isolation, eviction and events.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_breaker::{
    key_fn, BreakerConfig, BreakerEvent, BreakerLayer, BreakerRegistry, CircuitState,
    TransitionReason, WindowConfig,
};
use toolshield_core::{ErrorKind, ShieldResponse, SlowCall, ToolRequest, ToolResponse};
use tower::{Layer, Service, ServiceExt};

mod support;

use support::{call, calls, req, setup, Svc, Tool};

fn drain(
    rx: &mut tokio::sync::broadcast::Receiver<BreakerEvent>,
) -> Vec<(CircuitState, CircuitState, TransitionReason)> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push((e.from, e.to, e.reason));
    }
    out
}

fn rate_only(size: u32, min_calls: u32, rate: f64) -> BreakerConfig {
    BreakerConfig {
        consecutive_failures: 0,
        window: WindowConfig::count(size),
        min_calls,
        failure_rate: rate,
        ..BreakerConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_open_and_open_rejects_with_retry_after() {
    let (mut svc, registry, tool) = setup(BreakerConfig::default());
    let mut rx = registry.subscribe();
    calls(&mut svc, "weather", "fail", 4).await;
    assert_eq!(registry.state("weather"), CircuitState::Closed);
    assert_eq!(registry.status("weather").unwrap().consecutive_failures, 4);
    let _ = call(&mut svc, "weather", "fail").await;
    assert_eq!(registry.state("weather"), CircuitState::Open);
    assert_eq!(
        drain(&mut rx),
        vec![(
            CircuitState::Closed,
            CircuitState::Open,
            TransitionReason::ConsecutiveFailures
        )]
    );

    advance(Duration::from_secs(10)).await;
    let err = call(&mut svc, "weather", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(20)));
    assert_eq!(
        tool.calls.load(Ordering::SeqCst),
        5,
        "an open breaker does not call the tool"
    );
    assert_eq!(registry.rejections("weather"), 1);
    let status = registry.status("weather").unwrap();
    assert_eq!(status.time_until_half_open, Some(Duration::from_secs(20)));
    assert!(status.last_failure_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_consecutive_count() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    calls(&mut svc, "t", "fail", 4).await;
    call(&mut svc, "t", "ok").await.unwrap();
    calls(&mut svc, "t", "fail", 4).await;
    assert_eq!(registry.state("t"), CircuitState::Closed);
    assert_eq!(registry.status("t").unwrap().consecutive_failures, 4);
}

#[tokio::test(start_paused = true)]
async fn half_open_after_wait_and_a_success_closes() {
    let (mut svc, registry, tool) = setup(BreakerConfig::default());
    let mut rx = registry.subscribe();
    calls(&mut svc, "t", "fail", 5).await;
    advance(Duration::from_secs(29)).await;
    assert_eq!(
        call(&mut svc, "t", "ok").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );
    advance(Duration::from_secs(1)).await;
    call(&mut svc, "t", "ok").await.expect("the probe passes");
    assert_eq!(tool.probes.load(Ordering::SeqCst), 1, "the probe is marked");
    assert_eq!(registry.state("t"), CircuitState::Closed);
    assert_eq!(
        drain(&mut rx),
        vec![
            (
                CircuitState::Closed,
                CircuitState::Open,
                TransitionReason::ConsecutiveFailures
            ),
            (
                CircuitState::Open,
                CircuitState::HalfOpen,
                TransitionReason::WaitElapsed
            ),
            (
                CircuitState::HalfOpen,
                CircuitState::Closed,
                TransitionReason::ProbesSucceeded
            ),
        ]
    );
    let status = registry.status("t").unwrap();
    assert_eq!(status.consecutive_failures, 0);
    assert_eq!(status.calls_in_window, 0, "closing starts a fresh window");
}

#[tokio::test(start_paused = true)]
async fn a_probe_failure_reopens() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    let mut rx = registry.subscribe();
    calls(&mut svc, "t", "fail", 5).await;
    advance(Duration::from_secs(30)).await;
    assert_eq!(
        call(&mut svc, "t", "fail").await.unwrap_err().kind(),
        ErrorKind::UpstreamUnavailable
    );
    assert_eq!(registry.state("t"), CircuitState::Open);
    let events = drain(&mut rx);
    assert_eq!(
        events.last(),
        Some(&(
            CircuitState::HalfOpen,
            CircuitState::Open,
            TransitionReason::ProbeFailed
        ))
    );
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_exactly_k_probes_and_a_dropped_probe_frees_its_permit() {
    let (mut svc, registry, tool) = setup(BreakerConfig {
        half_open_permits: 2,
        ..BreakerConfig::default()
    });
    calls(&mut svc, "t", "fail", 5).await;
    advance(Duration::from_secs(30)).await;

    let p1 = svc.ready().await.unwrap().call(req("t", "hang"));
    let p2 = svc.ready().await.unwrap().call(req("t", "hang"));
    assert_eq!(registry.status("t").unwrap().probes_in_flight, 2);
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::CircuitOpen,
        "the K+1-th probe is rejected"
    );
    assert!(err.message().contains("probe limit"));
    assert_eq!(tool.probes.load(Ordering::SeqCst), 2);

    drop(p1);
    assert_eq!(registry.status("t").unwrap().probes_in_flight, 1);
    assert_eq!(
        registry.state("t"),
        CircuitState::HalfOpen,
        "a dropped probe records nothing"
    );
    let p3 = svc.ready().await.unwrap().call(req("t", "hang"));
    assert_eq!(
        tool.probes.load(Ordering::SeqCst),
        3,
        "the freed permit is reused"
    );
    drop((p2, p3));
    assert_eq!(registry.status("t").unwrap().probes_in_flight, 0);
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn s_successes_close_and_ignored_probes_count_for_nothing() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        half_open_successes: 3,
        ..BreakerConfig::default()
    });
    calls(&mut svc, "t", "fail", 5).await;
    advance(Duration::from_secs(30)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    call(&mut svc, "t", "ok").await.unwrap();
    let _ = call(&mut svc, "t", "invalid").await;
    let _ = call(&mut svc, "t", "cancel").await;
    assert_eq!(registry.state("t"), CircuitState::HalfOpen);
    assert_eq!(registry.status("t").unwrap().probes_in_flight, 0);
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn the_minimum_calls_rule_holds_the_rate_back() {
    let (mut svc, registry, _) = setup(rate_only(10, 6, 50.0));
    calls(&mut svc, "t", "fail", 5).await;
    assert_eq!(registry.state("t"), CircuitState::Closed, "5 calls < min 6");
    let status = registry.status("t").unwrap();
    assert_eq!((status.calls_in_window, status.failures_in_window), (5, 5));
    assert_eq!(status.failure_rate, 100.0);
    let mut rx = registry.subscribe();
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Open, "5 of 6 >= 50%");
    assert_eq!(drain(&mut rx)[0].2, TransitionReason::FailureRate);
}

#[tokio::test(start_paused = true)]
async fn the_count_window_slides() {
    let (mut svc, registry, _) = setup(rate_only(4, 4, 75.0));
    calls(&mut svc, "t", "fail", 2).await;
    calls(&mut svc, "t", "ok", 4).await;
    let s = registry.status("t").unwrap();
    assert_eq!(
        (s.calls_in_window, s.failures_in_window),
        (4, 0),
        "the failures slid out"
    );
    calls(&mut svc, "t", "fail", 2).await;
    assert_eq!(registry.status("t").unwrap().failure_rate, 50.0);
    assert_eq!(registry.state("t"), CircuitState::Closed);
    let _ = call(&mut svc, "t", "fail").await;
    assert_eq!(registry.state("t"), CircuitState::Open, "3 of the last 4");
}

#[tokio::test(start_paused = true)]
async fn the_time_window_slides() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 0,
        window: WindowConfig::time(Duration::from_secs(10), 10),
        min_calls: 3,
        failure_rate: 50.0,
        ..BreakerConfig::default()
    });
    calls(&mut svc, "t", "fail", 2).await;
    assert_eq!(registry.status("t").unwrap().calls_in_window, 2);
    advance(Duration::from_secs(5)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(
        registry.state("t"),
        CircuitState::Open,
        "2 of 3 within 10 s"
    );

    registry.reset("t");
    calls(&mut svc, "t", "fail", 2).await;
    advance(Duration::from_secs(11)).await;
    assert_eq!(registry.status("t").unwrap().calls_in_window, 0, "slid out");
    let _ = call(&mut svc, "t", "fail").await;
    calls(&mut svc, "t", "ok", 2).await;
    assert_eq!(registry.state("t"), CircuitState::Closed, "1 of 3");
    advance(Duration::from_secs(3)).await;
    let _ = call(&mut svc, "t", "fail").await;
    assert_eq!(registry.state("t"), CircuitState::Open, "2 of 4");
}

#[tokio::test(start_paused = true)]
async fn slow_calls_marked_by_the_timeout_layer_trip_the_slow_rate() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 0,
        window: WindowConfig::count(5),
        min_calls: 3,
        ..BreakerConfig::default()
    });
    let mut rx = registry.subscribe();
    call(&mut svc, "t", "slow").await.unwrap();
    call(&mut svc, "t", "slow").await.unwrap();
    assert_eq!(registry.status("t").unwrap().slow_call_rate, 100.0);
    assert_eq!(registry.state("t"), CircuitState::Closed);
    call(&mut svc, "t", "slow").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Open);
    assert_eq!(drain(&mut rx)[0].2, TransitionReason::SlowCallRate);

    // A slow probe keeps it open.
    advance(Duration::from_secs(30)).await;
    call(&mut svc, "t", "slow").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Open);
    assert_eq!(
        drain(&mut rx).last().unwrap().2,
        TransitionReason::ProbeSlow
    );
}

#[tokio::test(start_paused = true)]
async fn the_breakers_own_slow_threshold_counts_slow_calls() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 0,
        window: WindowConfig::count(4),
        min_calls: 2,
        slow_call_rate: Some(50.0),
        slow_call_duration: Some(Duration::from_secs(1)),
        ..BreakerConfig::default()
    });
    call(&mut svc, "t", "ok").await.unwrap();
    call(&mut svc, "t", "sleep").await.unwrap();
    let s = registry.status("t").unwrap();
    assert_eq!(s.slow_calls_in_window, 1);
    assert_eq!(
        registry.state("t"),
        CircuitState::Open,
        "1 slow of 2 >= 50%"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_that_takes_exactly_the_slow_call_duration_is_not_slow() {
    // Slow means slower than `slow_call_duration`, as in Resilience4j (a call whose
    // duration exceeds the threshold): the tool's "sleep" takes 2 s exactly.
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 0,
        window: WindowConfig::count(4),
        min_calls: 2,
        slow_call_rate: Some(50.0),
        slow_call_duration: Some(Duration::from_secs(2)),
        ..BreakerConfig::default()
    });
    call(&mut svc, "t", "ok").await.unwrap();
    call(&mut svc, "t", "sleep").await.unwrap();
    let s = registry.status("t").unwrap();
    assert_eq!(s.slow_calls_in_window, 0);
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn cancellations_and_client_errors_do_not_count() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 3,
        ..rate_only(10, 1, 10.0)
    });
    for r in ["cancel", "invalid", "not_found"] {
        calls(&mut svc, "t", r, 10).await;
    }
    let s = registry.status("t").unwrap();
    assert_eq!(s.state, CircuitState::Closed);
    assert_eq!((s.calls_in_window, s.consecutive_failures), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn rate_limits_unauthorized_and_in_band_errors_count() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 4,
        ..BreakerConfig::default()
    });
    for r in ["rate_limited", "unauthorized", "is_error"] {
        let _ = call(&mut svc, "t", r).await;
    }
    assert_eq!(registry.status("t").unwrap().consecutive_failures, 3);
    let _ = call(&mut svc, "t", "timeout").await;
    assert_eq!(registry.state("t"), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn growing_open_wait_is_capped() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        open_wait: Duration::from_secs(10),
        open_wait_multiplier: 2.0,
        max_open_wait: Duration::from_secs(25),
        ..BreakerConfig::default()
    });
    calls(&mut svc, "t", "fail", 5).await;
    let wait = |svc: &mut Svc| {
        let f = svc.call(req("t", "ok"));
        async move { f.await.unwrap_err().retry_after() }
    };
    assert_eq!(wait(&mut svc).await, Some(Duration::from_secs(10)));
    advance(Duration::from_secs(10)).await;
    let _ = call(&mut svc, "t", "fail").await;
    assert_eq!(wait(&mut svc).await, Some(Duration::from_secs(20)));
    advance(Duration::from_secs(20)).await;
    let _ = call(&mut svc, "t", "fail").await;
    assert_eq!(
        wait(&mut svc).await,
        Some(Duration::from_secs(25)),
        "capped"
    );
    advance(Duration::from_secs(25)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    calls(&mut svc, "t", "fail", 5).await;
    assert_eq!(
        wait(&mut svc).await,
        Some(Duration::from_secs(10)),
        "a close resets the growth"
    );
    assert_eq!(registry.state("t"), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn manual_states_and_reset() {
    let (mut svc, registry, tool) = setup(BreakerConfig::default());
    let mut rx = registry.subscribe();

    registry.force_open("t");
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(err.retry_after(), None);
    advance(Duration::from_secs(3600)).await;
    assert_eq!(
        call(&mut svc, "t", "ok").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    );
    assert_eq!(tool.calls.load(Ordering::SeqCst), 0);

    registry.force_closed("t");
    calls(&mut svc, "t", "fail", 20).await;
    let s = registry.status("t").unwrap();
    assert_eq!(s.state, CircuitState::Disabled);
    assert_eq!(
        (s.consecutive_failures, s.failures_in_window),
        (20, 20),
        "still records"
    );

    registry.metrics_only("t");
    calls(&mut svc, "t", "fail", 5).await;
    let s = registry.status("t").unwrap();
    assert_eq!(
        (s.state, s.shadow_state),
        (CircuitState::MetricsOnly, Some(CircuitState::Open))
    );
    call(&mut svc, "t", "ok")
        .await
        .expect("metrics-only never rejects");
    advance(Duration::from_secs(30)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(
        registry.status("t").unwrap().shadow_state,
        Some(CircuitState::Closed)
    );

    registry.reset("t");
    let s = registry.status("t").unwrap();
    assert_eq!(
        (s.state, s.calls_in_window, s.last_failure_at),
        (CircuitState::Closed, 0, None)
    );

    let events: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    let seen: Vec<_> = events
        .iter()
        .map(|e| (e.from, e.to, e.reason, e.shadow))
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                CircuitState::Closed,
                CircuitState::ForcedOpen,
                TransitionReason::ForcedOpen,
                false
            ),
            (
                CircuitState::ForcedOpen,
                CircuitState::Disabled,
                TransitionReason::ForcedClosed,
                false
            ),
            (
                CircuitState::Disabled,
                CircuitState::MetricsOnly,
                TransitionReason::MetricsOnly,
                false
            ),
            (
                CircuitState::Closed,
                CircuitState::Open,
                TransitionReason::ConsecutiveFailures,
                true
            ),
            (
                CircuitState::Open,
                CircuitState::HalfOpen,
                TransitionReason::WaitElapsed,
                true
            ),
            (
                CircuitState::HalfOpen,
                CircuitState::Closed,
                TransitionReason::ProbesSucceeded,
                true
            ),
            (
                CircuitState::MetricsOnly,
                CircuitState::Closed,
                TransitionReason::Reset,
                false
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn overrides_apply_to_all_keys() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    for k in ["a", "b", "c"] {
        call(&mut svc, k, "ok").await.unwrap();
    }
    registry.force_open_all();
    assert!(registry
        .status_all()
        .iter()
        .all(|s| s.state == CircuitState::ForcedOpen));
    registry.force_closed_all();
    assert!(registry
        .status_all()
        .iter()
        .all(|s| s.state == CircuitState::Disabled));
    registry.metrics_only_all();
    assert!(registry
        .status_all()
        .iter()
        .all(|s| s.state == CircuitState::MetricsOnly));
    registry.reset_all();
    let all = registry.status_all();
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|s| s.state == CircuitState::Closed));
}

#[tokio::test(start_paused = true)]
async fn state_is_shared_across_clones_and_separately_built_services() {
    let registry = BreakerRegistry::default();
    let tool = Tool::default();
    let mut a = BreakerLayer::new(registry.clone()).layer(tool.clone());
    let mut b = BreakerLayer::new(registry.clone()).layer(tool.clone());
    let mut a2 = a.clone();
    let (mut b2, mut a3) = (b.clone(), a.clone());
    for svc in [&mut a, &mut b, &mut a2, &mut b2, &mut a3] {
        let _ = svc.ready().await.unwrap().call(req("t", "fail")).await;
    }
    assert_eq!(
        registry.state("t"),
        CircuitState::Open,
        "5 failures across 5 services"
    );
    for svc in [&mut a, &mut b, &mut a2] {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(req("t", "ok"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    }
}

#[tokio::test(start_paused = true)]
async fn keys_are_isolated_and_a_key_fn_can_pick_them() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    calls(&mut svc, "weather", "fail", 5).await;
    call(&mut svc, "search", "ok").await.unwrap();
    assert_eq!(registry.state("weather"), CircuitState::Open);
    assert_eq!(registry.state("search"), CircuitState::Closed);

    let layer = BreakerLayer::new(BreakerRegistry::default()).key_fn(key_fn(|r: &ToolRequest| {
        Cow::Borrowed(r.meta().caller_id.as_deref().unwrap_or("-"))
    }));
    let registry = layer.registry().clone();
    let mut svc = layer.layer(Tool::default());
    for _ in 0..5 {
        let _ = svc
            .ready()
            .await
            .unwrap()
            .call(req("weather", "fail").caller("agent-1"))
            .await;
    }
    svc.ready()
        .await
        .unwrap()
        .call(req("weather", "ok").caller("agent-2"))
        .await
        .unwrap();
    assert_eq!(registry.state("agent-1"), CircuitState::Open);
    assert_eq!(registry.state("agent-2"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn idle_closed_breakers_are_evicted() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        idle_ttl: Duration::from_secs(60),
        ..BreakerConfig::default()
    });
    call(&mut svc, "a", "ok").await.unwrap();
    calls(&mut svc, "open", "fail", 5).await;
    registry.force_closed("manual");
    assert_eq!(registry.len(), 3);
    advance(Duration::from_secs(60)).await;
    call(&mut svc, "b", "ok").await.unwrap(); // a sweep: "a" was used since the last one
    assert!(registry.status("a").is_some());
    advance(Duration::from_secs(60)).await;
    call(&mut svc, "c", "ok").await.unwrap(); // a sweep: "a" idle since the last one
    assert!(
        registry.status("a").is_none(),
        "idle closed breaker evicted"
    );
    assert!(registry.status("b").is_some(), "used within the last ttl");
    assert!(registry.status("open").is_some(), "open breakers are kept");
    assert!(registry.status("manual").is_some(), "overrides are kept");
    assert_eq!(registry.len(), 4);

    // "c" is used again, "b" is not: an explicit pass evicts "b" only, the next one "c".
    call(&mut svc, "c", "ok").await.unwrap();
    assert_eq!(registry.evict_idle(), 1);
    assert!(registry.status("b").is_none());
    assert_eq!(registry.status("c").unwrap().calls_in_window, 2);
    assert_eq!(registry.evict_idle(), 1);
    assert!(registry.status("c").is_none());
    // Evicted state is never used again: a new breaker starts fresh.
    call(&mut svc, "c", "ok").await.unwrap();
    assert_eq!(registry.status("c").unwrap().calls_in_window, 1);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_keys_keeps_the_registry_bounded() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        max_keys: 8,
        ..BreakerConfig::default()
    });
    calls(&mut svc, "hot", "fail", 5).await;
    for i in 0..200 {
        call(&mut svc, &format!("key-{i}"), "ok").await.unwrap();
        assert!(registry.len() <= 8, "len {} at key {i}", registry.len());
    }
    assert_eq!(
        registry.state("hot"),
        CircuitState::Open,
        "the open breaker survived"
    );
}

#[tokio::test(start_paused = true)]
async fn the_json_lines_log_holds_every_transition() {
    let path = std::env::temp_dir().join(format!(
        "toolshield-breaker-{}-{}.jsonl",
        std::process::id(),
        line!()
    ));
    let _ = std::fs::remove_file(&path);
    let (mut svc, registry, _) = setup(BreakerConfig {
        events_file: Some(path.clone()),
        ..BreakerConfig::default()
    });
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    registry.on_event(move |e| sink.lock().unwrap().push(e.clone()));

    calls(&mut svc, "t", "fail", 5).await;
    advance(Duration::from_secs(30)).await;
    let _ = call(&mut svc, "t", "fail").await;
    advance(Duration::from_secs(30)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    registry.force_open("t");
    registry.reset("t");

    registry.flush_event_log();
    assert_eq!(registry.event_log_dropped(), 0);
    let text = std::fs::read_to_string(&path).unwrap();
    let logged: Vec<&str> = text.lines().collect();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(logged.len(), 7);
    let expected: Vec<String> = seen.iter().map(|e| e.json_line()).collect();
    assert_eq!(
        logged,
        expected.iter().map(|l| l.trim_end()).collect::<Vec<_>>(),
        "the file holds exactly what the callback saw"
    );
    for line in &logged {
        let parsed: serde_json::Value = serde_json::from_str(line).expect("each line is JSON");
        assert!(parsed["at"].as_str().is_some_and(|at| at.ends_with('Z')));
    }
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["key"], "t");
    assert_eq!(first["from"], "closed");
    assert_eq!(first["to"], "open");
    assert_eq!(first["reason"], "consecutive_failures");

    let counts = registry.transition_counts();
    let n = |from, to| {
        counts
            .iter()
            .find(|c| c.from == from && c.to == to)
            .map_or(0, |c| c.count)
    };
    assert_eq!(n(CircuitState::Closed, CircuitState::Open), 1);
    assert_eq!(n(CircuitState::HalfOpen, CircuitState::Open), 1);
    assert_eq!(n(CircuitState::Open, CircuitState::HalfOpen), 2);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(start_paused = true)]
async fn a_result_from_before_a_transition_is_not_recorded() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    let late = svc.ready().await.unwrap().call(req("t", "sleep"));
    let late = tokio::spawn(late);
    calls(&mut svc, "t", "fail", 5).await;
    advance(Duration::from_secs(30)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
    late.await.unwrap().unwrap();
    assert_eq!(
        registry.status("t").unwrap().calls_in_window,
        0,
        "late success not in the new window"
    );
}

#[test]
fn config_validation_lists_every_problem() {
    let bad = BreakerConfig {
        window: WindowConfig::count(0),
        min_calls: 0,
        failure_rate: 150.0,
        slow_call_rate: Some(0.0),
        open_wait: Duration::ZERO,
        open_wait_multiplier: 0.5,
        half_open_permits: 0,
        half_open_successes: 0,
        max_keys: 0,
        ..BreakerConfig::default()
    };
    let err = bad.validate().unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    for f in [
        "window.size",
        "min_calls",
        "failure_rate",
        "slow_call_rate",
        "open_wait",
        "open_wait_multiplier",
        "half_open_permits",
        "half_open_successes",
        "max_keys",
    ] {
        assert!(fields.contains(&f), "{f} missing from {fields:?}");
    }
    assert!(BreakerLayer::from_config(&bad).is_err());
    assert!(BreakerConfig::default().validate().is_ok());

    let unknown = serde_json::from_str::<BreakerConfig>(r#"{"treshold": 5}"#);
    assert!(unknown.is_err(), "unknown fields are rejected");
    let parsed: BreakerConfig =
        serde_json::from_str(r#"{"open_wait": "500ms", "window": {"type": "count", "size": 50}}"#)
            .unwrap();
    assert_eq!(parsed.open_wait, Duration::from_millis(500));
    assert_eq!(parsed.window, WindowConfig::count(50));
    let missing = BreakerConfig {
        events_file: Some("/nonexistent-dir/x/breaker.jsonl".into()),
        ..BreakerConfig::default()
    };
    let err = BreakerRegistry::new(missing).unwrap_err();
    assert_eq!(err.problems()[0].field, "events_file");
}

#[test]
fn memory_per_breaker_with_a_100_call_window_is_within_256_bytes() {
    let registry = BreakerRegistry::default();
    let bytes = registry.memory_per_breaker();
    assert!(bytes <= 256, "{bytes} bytes");
}

#[test]
fn a_slow_mark_is_visible_to_the_breaker() {
    let mut res = ToolResponse::new(json!({}));
    assert!(res.slow_call().is_none());
    res.mark_slow(SlowCall {
        elapsed: Duration::from_secs(3),
        threshold: Duration::from_secs(2),
    });
    assert!(res.slow_call().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_pinned_key_is_resolved_once_and_never_evicted_for_being_idle() {
    let registry = BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 2,
        idle_ttl: Duration::from_secs(60),
        ..BreakerConfig::default()
    })
    .expect("valid config");
    let layer = BreakerLayer::new(registry.clone()).pin_key("quote");
    assert!(
        registry.status("quote").is_some(),
        "the breaker exists as soon as the layer is built"
    );
    let template = layer.layer(Tool::default());
    // Every call on a fresh clone of a service that never ran, as a stack cloned per call
    // does: both failures land in the one breaker of the key.
    for _ in 0..2 {
        let mut svc = template.clone();
        let _ = call(&mut svc, "quote", "fail").await;
    }
    assert_eq!(registry.state("quote"), CircuitState::Open);
    let mut svc = template.clone();
    let err = call(&mut svc, "quote", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);

    // Closed again and idle for many sweeps: an unpinned key goes, the pinned one stays.
    registry.reset("quote");
    call(&mut svc, "weather", "ok").await.unwrap();
    for _ in 0..3 {
        advance(Duration::from_secs(61)).await;
        registry.evict_idle();
    }
    assert!(
        registry.status("weather").is_none(),
        "an idle key is evicted"
    );
    assert!(
        registry.status("quote").is_some(),
        "a pinned key is never evicted"
    );
    // The breaker the layer holds is still the registry's: an override reaches its calls.
    registry.force_open("quote");
    let mut svc = template.clone();
    let err = call(&mut svc, "quote", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
}

#[tokio::test(start_paused = true)]
async fn a_pinned_key_has_its_own_breaker_in_a_full_registry() {
    let registry = BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 1,
        max_keys: 2,
        ..BreakerConfig::default()
    })
    .expect("valid config");
    let mut flood = BreakerLayer::new(registry.clone()).layer(Tool::default());
    for key in ["x", "y", "z"] {
        call(&mut flood, key, "ok").await.unwrap();
    }
    let mut pinned = BreakerLayer::new(registry.clone())
        .pin_key("quote")
        .layer(Tool::default());
    let _ = call(&mut pinned, "quote", "fail").await;
    assert_eq!(
        registry.state("quote"),
        CircuitState::Open,
        "the pinned key trips its own breaker, not the overflow one"
    );
    // A call with another key through the pinned service is looked up as usual.
    call(&mut pinned, "x", "ok").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_probe_whose_outcome_panics_in_an_event_callback_frees_its_permit() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(1),
        ..BreakerConfig::default()
    });
    // A callback that panics on the first transition a probe's outcome makes, once
    // each (closing, then re-opening).
    let armed = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&armed);
    registry.on_event(move |e: &BreakerEvent| {
        let probe_outcome = matches!(
            e.reason,
            TransitionReason::ProbeFailed | TransitionReason::ProbesSucceeded
        );
        if probe_outcome && seen.fetch_add(1, Ordering::SeqCst) < 2 {
            panic!("callback bug");
        }
    });
    for (outcome, after) in [("ok", CircuitState::Closed), ("fail", CircuitState::Open)] {
        let _ = call(&mut svc, "t", "fail").await;
        assert_eq!(registry.state("t"), CircuitState::Open);
        advance(Duration::from_secs(2)).await;
        let probe = svc.ready().await.unwrap().call(req("t", outcome));
        let joined = tokio::spawn(probe).await;
        assert!(joined.unwrap_err().is_panic(), "the callback panicked");
        let status = registry.status("t").unwrap();
        assert_eq!(status.state, after);
        assert_eq!(status.probes_in_flight, 0, "the permit went back");
    }
    // The next phase can probe: the permit was not leaked.
    advance(Duration::from_secs(2)).await;
    call(&mut svc, "t", "ok")
        .await
        .expect("a probe is admitted");
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

/// Runs `body` on a thread of its own and fails (instead of hanging the suite) if it does
/// not finish: a deadlock shows as a failure. The bound is for a deadlock only; the body
/// takes milliseconds.
fn finishes<F: FnOnce() + Send + 'static>(body: F) {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the body panicked"),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("deadlock: the body did not finish")
        }
    }
}

#[test]
fn an_event_callback_may_call_its_own_breaker_again() {
    finishes(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let (mut svc, registry, _) = setup(BreakerConfig {
                consecutive_failures: 1,
                ..BreakerConfig::default()
            });
            let mut rx = registry.subscribe();
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let counts_seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let (sink, counts_sink, control) = (
                Arc::clone(&seen),
                Arc::clone(&counts_seen),
                registry.clone(),
            );
            // An auto-heal policy: whatever opens is reset at once; and a metrics read of
            // the counts from inside the callback.
            registry.on_event(move |e: &BreakerEvent| {
                sink.lock().unwrap().push((e.from, e.to, e.reason));
                counts_sink
                    .lock()
                    .unwrap()
                    .push(control.transition_counts().len());
                if e.to == CircuitState::Open {
                    assert_eq!(control.state(&e.key), CircuitState::Open);
                    control.reset(&e.key);
                }
            });
            // A second callback sees the events in the same order as the first.
            let second = Arc::new(std::sync::Mutex::new(Vec::new()));
            let second_sink = Arc::clone(&second);
            registry.on_event(move |e: &BreakerEvent| {
                second_sink.lock().unwrap().push((e.from, e.to, e.reason));
            });

            let _ = call(&mut svc, "t", "fail").await;
            assert_eq!(
                registry.state("t"),
                CircuitState::Closed,
                "reset by the callback"
            );
            let expected = vec![
                (
                    CircuitState::Closed,
                    CircuitState::Open,
                    TransitionReason::ConsecutiveFailures,
                ),
                (
                    CircuitState::Open,
                    CircuitState::Closed,
                    TransitionReason::Reset,
                ),
            ];
            assert_eq!(*seen.lock().unwrap(), expected);
            assert_eq!(
                *second.lock().unwrap(),
                expected,
                "every sink in transition order"
            );
            assert_eq!(drain(&mut rx), expected);
            assert_eq!(registry.transition_counts().len(), 2);
            // The breaker still works: it trips again, and is healed again.
            let _ = call(&mut svc, "t", "fail").await;
            assert_eq!(registry.state("t"), CircuitState::Closed);
            assert_eq!(seen.lock().unwrap().len(), 4);
        });
    });
}

#[tokio::test(start_paused = true)]
async fn a_probe_failing_after_a_reset_leaves_no_failure_time() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 1,
        ..BreakerConfig::default()
    });
    let _ = call(&mut svc, "k", "fail").await;
    assert_eq!(registry.state("k"), CircuitState::Open);
    advance(Duration::from_secs(31)).await;
    // A probe admitted in half-open, still running when the operator resets the key.
    let probe = tokio::spawn(svc.ready().await.unwrap().call(req("k", "sleep_fail")));
    tokio::task::yield_now().await;
    assert_eq!(registry.state("k"), CircuitState::HalfOpen);
    registry.reset("k");
    assert!(registry.status("k").unwrap().last_failure_at.is_none());
    advance(Duration::from_secs(3)).await;
    assert!(probe.await.unwrap().is_err());
    // Its failure belongs to the phase the reset ended: nothing of it is kept.
    let status = registry.status("k").unwrap();
    assert_eq!(status.state, CircuitState::Closed);
    assert_eq!(status.last_failure_at, None, "{status:?}");
    assert_eq!(status.consecutive_failures, 0);
}
