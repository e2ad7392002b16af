//! The breaker's state machine as a Resilience4j or Polly user expects it (with the
//! differences `docs/breaker.md` states), and as the source requirements describe it:
//! thresholds, windows, half-open probes, outcomes that do not count, manual states,
//! sharing and extreme durations.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_breaker::{key_fn, BreakerConfig, BreakerLayer, CircuitState, WindowConfig};
use toolshield_core::config::MAX_DURATION;
use toolshield_core::{ErrorKind, ToolRequest};
use tower::{Layer, Service, ServiceExt};

mod support;

use support::{call, calls, req, setup, Tool};

/// Only the failure-rate trip: no consecutive trip, no slow-call trip.
fn rate_only(size: u32, min_calls: u32, rate: f64) -> BreakerConfig {
    BreakerConfig {
        consecutive_failures: 0,
        window: WindowConfig::count(size),
        min_calls,
        failure_rate: rate,
        slow_call_rate: None,
        ..BreakerConfig::default()
    }
}

/// Opens on the first failure, so the tests of the half-open state get there in one call.
fn opens_at_once(permits: u32, successes: u32) -> BreakerConfig {
    BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(30),
        half_open_permits: permits,
        half_open_successes: successes,
        ..BreakerConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_rate_equal_to_the_threshold_opens_the_breaker() {
    let (mut svc, registry, _) = setup(rate_only(10, 10, 50.0));
    calls(&mut svc, "t", "ok", 5).await;
    calls(&mut svc, "t", "fail", 4).await;
    assert_eq!(
        registry.state("t"),
        CircuitState::Closed,
        "9 calls < min_calls"
    );
    calls(&mut svc, "t", "fail", 1).await;
    assert_eq!(
        registry.state("t"),
        CircuitState::Open,
        "5 failures of 10 calls is 50 %, and 50 % >= 50 % trips"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_rate_just_below_the_threshold_keeps_the_breaker_closed() {
    let (mut svc, registry, _) = setup(rate_only(10, 10, 50.0));
    calls(&mut svc, "t", "ok", 6).await;
    calls(&mut svc, "t", "fail", 4).await;
    assert_eq!(registry.state("t"), CircuitState::Closed);
    let status = registry.status("t").unwrap();
    assert_eq!(status.calls_in_window, 10);
    assert_eq!(status.failures_in_window, 4);
}

#[tokio::test(start_paused = true)]
async fn no_rate_is_evaluated_before_the_window_holds_the_minimum_number_of_calls() {
    let (mut svc, registry, _) = setup(rate_only(100, 20, 50.0));
    calls(&mut svc, "t", "fail", 19).await;
    assert_eq!(registry.state("t"), CircuitState::Closed, "19 < 20 calls");
    calls(&mut svc, "t", "fail", 1).await;
    assert_eq!(registry.state("t"), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn failures_older_than_the_time_window_no_longer_count() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        window: WindowConfig::time(Duration::from_secs(60), 6),
        ..rate_only(100, 4, 50.0)
    });
    calls(&mut svc, "t", "fail", 3).await;
    advance(Duration::from_secs(61)).await;
    calls(&mut svc, "t", "ok", 3).await;
    let status = registry.status("t").unwrap();
    assert_eq!(status.calls_in_window, 3, "the failures left the window");
    assert_eq!(status.failures_in_window, 0);
    calls(&mut svc, "t", "fail", 1).await;
    assert_eq!(
        registry.state("t"),
        CircuitState::Closed,
        "1 failure of 4 calls in the last 60 s is 25 %"
    );
    calls(&mut svc, "t", "fail", 2).await;
    assert_eq!(registry.state("t"), CircuitState::Open, "3 of 6 is 50 %");
}

#[tokio::test(start_paused = true)]
async fn a_slow_call_feeds_the_slow_rate_and_is_not_a_failure() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 2,
        window: WindowConfig::count(4),
        min_calls: 4,
        slow_call_rate: Some(50.0),
        slow_call_duration: Some(Duration::from_secs(1)),
        ..BreakerConfig::default()
    });
    calls(&mut svc, "t", "sleep", 1).await;
    let status = registry.status("t").unwrap();
    assert_eq!(status.slow_calls_in_window, 1);
    assert_eq!(status.failures_in_window, 0);
    assert_eq!(status.consecutive_failures, 0, "slow is not a failure");
    calls(&mut svc, "t", "ok", 2).await;
    assert_eq!(registry.state("t"), CircuitState::Closed);
    calls(&mut svc, "t", "sleep", 1).await;
    assert_eq!(
        registry.state("t"),
        CircuitState::Open,
        "2 slow calls of 4 is 50 %"
    );
}

#[tokio::test(start_paused = true)]
async fn the_consecutive_failure_trip_opens_on_the_threshold_and_not_before() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    calls(&mut svc, "t", "fail", 4).await;
    assert_eq!(registry.state("t"), CircuitState::Closed);
    assert_eq!(registry.status("t").unwrap().consecutive_failures, 4);
    calls(&mut svc, "t", "fail", 1).await;
    assert_eq!(registry.state("t"), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_stays_open_for_the_whole_wait_then_admits_a_probe() {
    let (mut svc, registry, tool) = setup(opens_at_once(1, 1));
    calls(&mut svc, "t", "fail", 1).await;
    let before = tool.calls.load(Ordering::SeqCst);
    advance(Duration::from_secs(30) - Duration::from_millis(1)).await;
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_millis(1)));
    assert_eq!(tool.calls.load(Ordering::SeqCst), before, "not called");
    advance(Duration::from_millis(1)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_the_permitted_probes_and_rejects_one_more_without_counting_it() {
    let (mut svc, registry, tool) = setup(opens_at_once(3, 2));
    calls(&mut svc, "t", "fail", 1).await;
    advance(Duration::from_secs(30)).await;
    let probes: Vec<_> = (0..3).map(|_| svc.call(req("t", "sleep"))).collect();
    assert_eq!(registry.state("t"), CircuitState::HalfOpen);
    assert_eq!(registry.status("t").unwrap().probes_in_flight, 3);
    let called = tool.calls.load(Ordering::SeqCst);
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(
        err.retry_after(),
        None,
        "a full half-open breaker names no wait"
    );
    assert_eq!(tool.calls.load(Ordering::SeqCst), called, "not called");
    assert_eq!(
        registry.state("t"),
        CircuitState::HalfOpen,
        "a rejected call is no probe outcome"
    );
    for probe in probes {
        probe.await.unwrap();
    }
    assert_eq!(registry.state("t"), CircuitState::Closed, "S = 2 successes");
    let status = registry.status("t").unwrap();
    assert_eq!(status.probes_in_flight, 0);
    assert_eq!(status.calls_in_window, 0, "closing starts a fresh window");
}

#[tokio::test(start_paused = true)]
async fn one_success_short_of_the_needed_successes_keeps_the_breaker_half_open() {
    let (mut svc, registry, _) = setup(opens_at_once(3, 2));
    calls(&mut svc, "t", "fail", 1).await;
    advance(Duration::from_secs(30)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::HalfOpen);
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_for_a_fresh_wait() {
    let (mut svc, registry, _) = setup(opens_at_once(3, 2));
    calls(&mut svc, "t", "fail", 1).await;
    advance(Duration::from_secs(30)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    call(&mut svc, "t", "fail").await.unwrap_err();
    assert_eq!(registry.state("t"), CircuitState::Open);
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_its_permit_and_decides_nothing() {
    let (mut svc, registry, _) = setup(opens_at_once(1, 1));
    calls(&mut svc, "t", "fail", 1).await;
    advance(Duration::from_secs(30)).await;
    let probe = svc.call(req("t", "hang"));
    assert_eq!(registry.status("t").unwrap().probes_in_flight, 1);
    drop(probe);
    assert_eq!(registry.status("t").unwrap().probes_in_flight, 0);
    assert_eq!(registry.state("t"), CircuitState::HalfOpen);
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_panics_frees_its_permit() {
    let (mut svc, registry, _) = setup(opens_at_once(1, 1));
    calls(&mut svc, "t", "fail", 1).await;
    advance(Duration::from_secs(30)).await;
    let probe = svc.call(req("t", "panic"));
    let joined = tokio::spawn(probe).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(registry.status("t").unwrap().probes_in_flight, 0);
    assert_eq!(registry.state("t"), CircuitState::HalfOpen);
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_or_ignored_probe_neither_closes_nor_reopens() {
    let (mut svc, registry, _) = setup(opens_at_once(1, 1));
    calls(&mut svc, "t", "fail", 1).await;
    advance(Duration::from_secs(30)).await;
    for step in ["cancel", "invalid"] {
        call(&mut svc, "t", step).await.unwrap_err();
        assert_eq!(registry.state("t"), CircuitState::HalfOpen, "{step}");
        assert_eq!(registry.status("t").unwrap().probes_in_flight, 0, "{step}");
    }
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn cancelled_and_ignored_calls_are_neither_failures_nor_successes() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    calls(&mut svc, "t", "fail", 4).await;
    calls(&mut svc, "t", "cancel", 3).await;
    calls(&mut svc, "t", "invalid", 3).await;
    let status = registry.status("t").unwrap();
    assert_eq!(status.calls_in_window, 4, "nothing recorded for them");
    assert_eq!(
        status.consecutive_failures, 4,
        "and the run of failures is not broken"
    );
    calls(&mut svc, "t", "fail", 1).await;
    assert_eq!(registry.state("t"), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_by_its_caller_while_closed_is_not_a_failure() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    calls(&mut svc, "t", "fail", 4).await;
    for _ in 0..3 {
        drop(svc.call(req("t", "hang")));
    }
    let status = registry.status("t").unwrap();
    assert_eq!(status.calls_in_window, 4);
    assert_eq!(status.consecutive_failures, 4);
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn forced_open_rejects_without_a_wait_and_reset_starts_afresh() {
    let (mut svc, registry, tool) = setup(BreakerConfig::default());
    calls(&mut svc, "t", "fail", 3).await;
    registry.force_open("t");
    let status = registry.status("t").unwrap();
    assert_eq!(status.state, CircuitState::ForcedOpen);
    assert_eq!(
        status.calls_in_window, 0,
        "an override starts a fresh window"
    );
    assert_eq!(status.consecutive_failures, 0);
    let called = tool.calls.load(Ordering::SeqCst);
    advance(Duration::from_secs(3600)).await;
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(err.retry_after(), None);
    assert_eq!(tool.calls.load(Ordering::SeqCst), called);
    assert_eq!(
        registry.state("t"),
        CircuitState::ForcedOpen,
        "no wait ends it"
    );
    registry.reset("t");
    let status = registry.status("t").unwrap();
    assert_eq!(status.state, CircuitState::Closed);
    assert_eq!(status.last_failure_at, None);
    call(&mut svc, "t", "ok").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_disabled_breaker_records_but_never_trips_and_reset_clears_what_it_recorded() {
    let (mut svc, registry, _) = setup(BreakerConfig::default());
    registry.force_closed("t");
    calls(&mut svc, "t", "fail", 50).await;
    let status = registry.status("t").unwrap();
    assert_eq!(status.state, CircuitState::Disabled);
    assert_eq!(status.failures_in_window, 50);
    call(&mut svc, "t", "ok").await.unwrap();
    registry.reset("t");
    let status = registry.status("t").unwrap();
    assert_eq!(status.state, CircuitState::Closed);
    assert_eq!(status.calls_in_window, 0);
    assert_eq!(status.consecutive_failures, 0);
    calls(&mut svc, "t", "fail", 4).await;
    assert_eq!(registry.state("t"), CircuitState::Closed, "counting from 0");
}

#[tokio::test(start_paused = true)]
async fn forcing_an_open_breaker_closed_admits_calls_at_once() {
    let (mut svc, registry, _) = setup(opens_at_once(1, 1));
    calls(&mut svc, "t", "fail", 1).await;
    registry.force_closed("t");
    call(&mut svc, "t", "ok").await.unwrap();
    calls(&mut svc, "t", "fail", 3).await;
    assert_eq!(registry.state("t"), CircuitState::Disabled);
}

#[tokio::test(start_paused = true)]
async fn every_service_built_from_clones_of_one_layer_shares_each_keys_breaker() {
    let layer = BreakerLayer::from_config(&BreakerConfig::default()).unwrap();
    let other_layer = layer.clone();
    let mut a = layer.layer(Tool::default());
    let mut b = other_layer.layer(Tool::default());
    let mut c = a.clone();
    for svc in [&mut a, &mut b, &mut c] {
        let _ = call(svc, "t", "fail").await;
    }
    let _ = call(&mut a, "t", "fail").await;
    let _ = call(&mut b, "t", "fail").await;
    assert_eq!(layer.registry().state("t"), CircuitState::Open);
    let err = call(&mut c, "t", "ok").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    call(&mut c, "other", "ok").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn breakers_per_provider_are_isolated() {
    let layer = BreakerLayer::from_config(&opens_at_once(1, 1))
        .unwrap()
        .key_fn(key_fn(|r: &ToolRequest| {
            Cow::Owned(r.payload()["provider"].as_str().unwrap_or("-").to_owned())
        }));
    let registry = layer.registry().clone();
    let mut svc = layer.layer(Tool::default());
    let call_provider =
        |provider: &str, r: &str| ToolRequest::new("chat", json!({"provider": provider, "r": r}));
    let _ = svc
        .ready()
        .await
        .unwrap()
        .call(call_provider("anthropic", "fail"))
        .await;
    svc.ready()
        .await
        .unwrap()
        .call(call_provider("openai", "ok"))
        .await
        .unwrap();
    assert_eq!(registry.state("anthropic"), CircuitState::Open);
    assert_eq!(registry.state("openai"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn the_longest_waits_accepted_neither_panic_nor_end_early() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: MAX_DURATION,
        max_open_wait: MAX_DURATION,
        open_wait_multiplier: 1000.0,
        slow_call_duration: Some(MAX_DURATION),
        window: WindowConfig::time(MAX_DURATION, 4096),
        idle_ttl: MAX_DURATION,
        ..BreakerConfig::default()
    });
    call(&mut svc, "t", "ok").await.unwrap();
    calls(&mut svc, "t", "fail", 1).await;
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(err.retry_after(), Some(MAX_DURATION));
    advance(MAX_DURATION - Duration::from_secs(1)).await;
    assert_eq!(
        registry.status("t").unwrap().time_until_half_open,
        Some(Duration::from_secs(1))
    );
    advance(Duration::from_secs(1)).await;
    calls(&mut svc, "t", "fail", 1).await;
    assert_eq!(registry.state("t"), CircuitState::Open, "the probe failed");
    let err = call(&mut svc, "t", "ok").await.unwrap_err();
    assert_eq!(err.retry_after(), Some(MAX_DURATION), "capped");
}

#[tokio::test(start_paused = true)]
async fn the_shortest_waits_accepted_work() {
    let (mut svc, registry, _) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_nanos(1),
        max_open_wait: Duration::from_nanos(1),
        slow_call_duration: Some(Duration::from_nanos(1)),
        slow_call_rate: None,
        window: WindowConfig::time(Duration::from_millis(1), 1),
        idle_ttl: Duration::from_nanos(1),
        ..BreakerConfig::default()
    });
    calls(&mut svc, "t", "fail", 1).await;
    advance(Duration::from_nanos(1)).await;
    call(&mut svc, "t", "ok").await.unwrap();
    assert_eq!(registry.state("t"), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_rejection_names_its_key_on_one_bounded_line() {
    // The key may be a tool name a model chose: the `CIRCUIT_OPEN` message that goes back
    // to the model and into logs names it printably and cut short, whatever it holds.
    let (mut svc, registry, _) = setup(opens_at_once(1, 1));
    let key = format!("evil\nINFO forged line\u{2028}{}", "k".repeat(4_000));
    let _ = call(&mut svc, &key, "fail").await;
    assert_eq!(
        registry.status(&key).map(|s| s.state),
        Some(CircuitState::Open)
    );
    let err = call(&mut svc, &key, "ok").await.expect_err("rejected");
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    let message = err.message();
    assert!(
        !message.chars().any(|c| c.is_control() || c == '\u{2028}'),
        "{message:?}"
    );
    assert!(message.len() < 300, "{} bytes", message.len());
    assert!(message.contains("evil INFO forged line"), "{message:?}");
}
