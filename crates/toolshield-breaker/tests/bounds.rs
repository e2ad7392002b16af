//! Bounds under hostile input, with tokio's paused clock: a flood of distinct keys leaves
//! no per-key state behind once its breakers are evicted, and a time-window bucket from
//! long ago never reads as current, whatever the gap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_breaker::{
    BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState, WindowConfig,
};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{BoxedTool, FailOnPayload};
use tower::{Layer, Service, ServiceExt};

type Svc = BoxedTool;

/// A breaker layer over a tool that fails when the payload says `"fail"`.
fn setup(config: BreakerConfig) -> (Svc, BreakerRegistry) {
    let layer = BreakerLayer::from_config(&config).expect("valid config");
    let registry = layer.registry().clone();
    let tool = FailOnPayload::new("r", ErrorKind::UpstreamUnavailable);
    (BoxedTool::new(layer.layer(tool)), registry)
}

async fn call(svc: &mut Svc, key: &str, r: &str) -> Result<ToolResponse, ToolError> {
    toolshield_test::call(svc, ToolRequest::new(key, json!({ "r": r }))).await
}

#[tokio::test(start_paused = true)]
async fn evicted_breakers_leave_no_per_key_state_and_the_totals_stay_true() {
    let (mut svc, registry) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(1),
        max_keys: 10,
        ..BreakerConfig::default()
    });
    let events = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&events);
    registry.on_event(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
    });
    let mut rejected = 0u64;
    for i in 0..2_000 {
        // Each key opens, rejects a call, goes half-open and closes: three transitions.
        let key = format!("server__tool-{i}");
        let _ = call(&mut svc, &key, "fail").await;
        if let Err(e) = call(&mut svc, &key, "ok").await {
            assert_eq!(e.kind(), ErrorKind::CircuitOpen);
            rejected += 1;
        }
        advance(Duration::from_secs(1)).await;
        call(&mut svc, &key, "ok").await.unwrap();

        let counts = registry.transition_counts();
        let mut keys: Vec<&str> = counts.iter().map(|c| &*c.key).collect();
        keys.dedup();
        assert!(
            registry.len() <= 10,
            "{} breakers at key {i}",
            registry.len()
        );
        assert!(
            keys.len() <= 10,
            "transition counts kept for {} keys at key {i}",
            keys.len()
        );
    }
    assert!(rejected > 1_000, "most keys went through open: {rejected}");
    // The service caches the breaker of its last key: let it go.
    drop(svc);

    // Nothing was lost: what the held breakers count plus what the evicted ones counted
    // is every event and every rejection.
    let evicted = registry.evicted_counts();
    let held: u64 = registry.transition_counts().iter().map(|c| c.count).sum();
    let gone: u64 = evicted.transitions.iter().map(|t| t.2).sum();
    assert_eq!(held + gone, events.load(Ordering::SeqCst));
    let held_rejections: u64 = registry.status_all().iter().map(|s| s.rejections).sum();
    assert_eq!(held_rejections + evicted.rejections, rejected);
    let pair = |from, to| {
        evicted
            .transitions
            .iter()
            .find(|t| t.0 == from && t.1 == to)
            .map_or(0, |t| t.2)
    };
    assert!(pair(CircuitState::HalfOpen, CircuitState::Closed) >= 1_900);
}

#[tokio::test(start_paused = true)]
async fn a_time_bucket_older_than_the_window_is_empty_whatever_the_gap() {
    const WRAP: u64 = 1 << 16; // what a 16-bit bucket tag can tell apart
    for (bucket, buckets) in [
        (Duration::from_secs(1), 10u32),
        (Duration::from_millis(1), 100),
    ] {
        let (mut svc, registry) = setup(BreakerConfig {
            consecutive_failures: 0,
            window: WindowConfig::time(bucket * buckets, buckets),
            min_calls: 5,
            failure_rate: 50.0,
            ..BreakerConfig::default()
        });
        let n = u64::from(buckets);
        for gap in [
            WRAP,
            2 * WRAP,
            3 * WRAP,
            WRAP - 1,
            WRAP + 1,
            WRAP + n - 1,
            7 * WRAP + 3,
            n,
            n + 1,
            1_000_003,
        ] {
            registry.reset("t");
            for _ in 0..4 {
                let _ = call(&mut svc, "t", "fail").await;
            }
            assert_eq!(registry.status("t").unwrap().failures_in_window, 4);
            advance(bucket * u32::try_from(gap).unwrap()).await;
            assert_eq!(
                registry.status("t").unwrap().calls_in_window,
                0,
                "{bucket:?} x {gap}: the failures left the window"
            );
            call(&mut svc, "t", "ok").await.unwrap();
            let s = registry.status("t").unwrap();
            assert_eq!(
                (s.state, s.calls_in_window, s.failures_in_window),
                (CircuitState::Closed, 1, 0),
                "{bucket:?} x {gap}: one success in the window"
            );
        }
        // Within the window the failures still count: 4 of 5 opens it.
        registry.reset("t");
        for _ in 0..4 {
            let _ = call(&mut svc, "t", "fail").await;
        }
        advance(bucket * (buckets - 1)).await;
        call(&mut svc, "t", "ok").await.unwrap();
        assert_eq!(registry.state("t"), CircuitState::Open, "{bucket:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn idle_breakers_left_open_past_their_wait_do_not_pin_the_registry_full() {
    let (mut svc, registry) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(1),
        max_keys: 10,
        idle_ttl: Duration::from_secs(60),
        ..BreakerConfig::default()
    });
    // A model floods failing names once each: every breaker opens and is never called
    // again.
    for i in 0..10 {
        let _ = call(&mut svc, &format!("server__junk-{i}"), "fail").await;
    }
    assert_eq!(registry.len(), 10);
    assert_eq!(registry.state("server__junk-0"), CircuitState::Open);
    // Long after their wait, real keys still get kept breakers.
    advance(Duration::from_secs(120)).await;
    for i in 0..5 {
        call(&mut svc, &format!("real-{i}"), "ok")
            .await
            .expect("ok");
    }
    assert!(registry.status("real-4").is_some(), "a new key is kept");
    assert!(registry.len() <= 10);
    assert_eq!(
        registry.overflowed(),
        0,
        "no call ran under an unkept breaker"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_half_open_breakers_with_no_probe_in_flight_do_not_pin_the_registry_full() {
    let (mut svc, registry) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(1),
        max_keys: 10,
        idle_ttl: Duration::from_secs(60),
        ..BreakerConfig::default()
    });
    for i in 0..10 {
        let _ = call(&mut svc, &format!("server__junk-{i}"), "fail").await;
    }
    // After the wait each name is called once more and the caller gives up on that call
    // (its probe is dropped unfinished): every breaker is half-open, with no probe in
    // flight, and is never called again.
    advance(Duration::from_secs(2)).await;
    for i in 0..10 {
        let key = format!("server__junk-{i}");
        let probe = svc
            .ready()
            .await
            .expect("ready")
            .call(ToolRequest::new(key.as_str(), json!({ "r": "ok" })));
        drop(probe);
        let status = registry.status(&key).expect("held");
        assert_eq!(status.state, CircuitState::HalfOpen);
        assert_eq!(status.probes_in_flight, 0);
    }
    // Long after, real keys still get kept breakers.
    advance(Duration::from_secs(120)).await;
    for i in 0..5 {
        call(&mut svc, &format!("real-{i}"), "ok")
            .await
            .expect("ok");
    }
    assert!(registry.status("real-4").is_some(), "a new key is kept");
    assert!(registry.len() <= 10);
    assert_eq!(
        registry.overflowed(),
        0,
        "no call ran under an unkept breaker"
    );
}

#[tokio::test(start_paused = true)]
async fn a_half_open_breaker_with_a_probe_in_flight_is_not_evicted() {
    let (mut svc, registry) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(1),
        max_keys: 1,
        idle_ttl: Duration::from_secs(60),
        ..BreakerConfig::default()
    });
    let _ = call(&mut svc, "probing", "fail").await;
    advance(Duration::from_secs(2)).await;
    // A probe that never finishes while the test holds it.
    let mut hung = tower::service_fn(|_req: ToolRequest| {
        std::future::pending::<Result<ToolResponse, ToolError>>()
    });
    let layer = toolshield_breaker::BreakerLayer::new(registry.clone());
    let probe = layer
        .layer(&mut hung)
        .call(ToolRequest::new("probing", json!({})));
    assert_eq!(registry.status("probing").unwrap().probes_in_flight, 1);
    advance(Duration::from_secs(300)).await;
    let _ = call(&mut svc, "other", "ok").await;
    assert_eq!(
        registry.state("probing"),
        CircuitState::HalfOpen,
        "kept while its probe runs"
    );
    drop(probe);
}

#[test]
fn durations_beyond_the_bound_are_rejected_with_every_other_problem() {
    let huge = Duration::from_secs(u64::MAX / 4);
    let cfg = BreakerConfig {
        open_wait: huge,
        max_open_wait: huge,
        idle_ttl: huge,
        slow_call_duration: Some(huge),
        failure_rate: 0.0,
        ..BreakerConfig::default()
    };
    let err = cfg.validate().expect_err("rejected");
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    for f in [
        "open_wait",
        "max_open_wait",
        "idle_ttl",
        "slow_call_duration",
        "failure_rate",
    ] {
        assert!(fields.contains(&f), "{f} missing from {err}");
    }
    let window = BreakerConfig {
        window: WindowConfig::time(huge, 10),
        ..BreakerConfig::default()
    };
    assert!(window.validate().is_err());
}

#[tokio::test(start_paused = true)]
async fn keys_longer_than_the_key_bound_are_never_held_by_the_registry() {
    // Breakers keyed by a name the request carries (a host, an agent): a hostile caller
    // sends megabyte names, each once.
    let layer = BreakerLayer::from_config(&BreakerConfig {
        consecutive_failures: 1,
        max_keys: 10,
        ..BreakerConfig::default()
    })
    .expect("valid config")
    .key_fn(toolshield_breaker::key_fn(|req: &ToolRequest| {
        std::borrow::Cow::Owned(req.payload()["host"].as_str().unwrap_or("").to_owned())
    }));
    let registry = layer.registry().clone();
    let mut svc =
        BoxedTool::new(layer.layer(FailOnPayload::new("r", ErrorKind::UpstreamUnavailable)));
    let long = "h".repeat(toolshield_breaker::MAX_KEY_LEN + 1);
    for _ in 0..3 {
        let req = ToolRequest::new("fetch", json!({ "host": long, "r": "ok" }));
        toolshield_test::call(&mut svc, req)
            .await
            .expect("admitted");
    }
    assert_eq!(registry.len(), 0, "no breaker holds a key over the bound");
    assert!(registry.status(&long).is_none());
    assert_eq!(registry.overflowed(), 3, "each such call is counted");
    // A key at the bound is kept as any other.
    let at_bound = "h".repeat(toolshield_breaker::MAX_KEY_LEN);
    let req = ToolRequest::new("fetch", json!({ "host": at_bound, "r": "ok" }));
    toolshield_test::call(&mut svc, req)
        .await
        .expect("admitted");
    assert_eq!(registry.len(), 1);
    assert!(registry.status(&at_bound).is_some());
}

#[tokio::test(start_paused = true)]
async fn an_override_of_a_key_over_the_bound_holds_for_its_calls() {
    // An operator forces open a breaker keyed by a long name (from the admin API, say):
    // the calls with that key run under the forced breaker, not the overflow one.
    let layer = BreakerLayer::from_config(&BreakerConfig::default())
        .expect("valid config")
        .key_fn(toolshield_breaker::key_fn(|req: &ToolRequest| {
            std::borrow::Cow::Owned(req.payload()["host"].as_str().unwrap_or("").to_owned())
        }));
    let registry = layer.registry().clone();
    let mut svc =
        BoxedTool::new(layer.layer(FailOnPayload::new("r", ErrorKind::UpstreamUnavailable)));
    let long = "h".repeat(toolshield_breaker::MAX_KEY_LEN + 1);
    registry.force_open(&long);
    let req = ToolRequest::new("fetch", json!({ "host": long, "r": "ok" }));
    let err = toolshield_test::call(&mut svc, req)
        .await
        .expect_err("the forced breaker rejects");
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(
        registry.overflowed(),
        0,
        "the call ran under the held breaker"
    );
    // Another long key is still never held.
    let other = "g".repeat(toolshield_breaker::MAX_KEY_LEN + 1);
    let req = ToolRequest::new("fetch", json!({ "host": other, "r": "ok" }));
    toolshield_test::call(&mut svc, req)
        .await
        .expect("admitted");
    assert_eq!(registry.overflowed(), 1);
    assert!(registry.status(&other).is_none());
    // Reset lifts the override: the key's calls pass again.
    registry.reset(&long);
    let req = ToolRequest::new("fetch", json!({ "host": long, "r": "ok" }));
    toolshield_test::call(&mut svc, req)
        .await
        .expect("admitted after the reset");
}

#[test]
fn a_key_count_bound_above_max_keys_is_a_config_error() {
    // A registry bound of usize::MAX is no bound against a flood of distinct keys.
    use toolshield_core::config::MAX_KEYS;
    for max_keys in [0, MAX_KEYS + 1, usize::MAX] {
        let cfg = BreakerConfig {
            max_keys,
            ..BreakerConfig::default()
        };
        let err = cfg.validate().expect_err("refused");
        assert_eq!(err.problems()[0].field, "max_keys", "{max_keys}: {err}");
    }
    let at_bound = BreakerConfig {
        max_keys: MAX_KEYS,
        ..BreakerConfig::default()
    };
    assert!(at_bound.validate().is_ok());
}

/// `state_counts` (what `/healthz` reads on every request) counts what `status_all`
/// reports, state by state, without copying a key.
#[test]
fn state_counts_agree_with_the_status_of_every_breaker() {
    let registry = toolshield_breaker::BreakerRegistry::default();
    for i in 0..40 {
        let key = format!("tool-{i}");
        match i % 5 {
            0 => registry.force_open(&key),
            1 => registry.force_closed(&key),
            2 => registry.metrics_only(&key),
            _ => registry.reset(&key),
        }
    }
    let counts = registry.state_counts();
    assert_eq!(counts.len(), toolshield_breaker::CircuitState::ALL.len());
    let statuses = registry.status_all();
    for (state, n) in counts {
        let expected = statuses.iter().filter(|s| s.state == state).count();
        assert_eq!(n, expected, "{state:?}");
    }
    assert_eq!(counts.iter().map(|(_, n)| n).sum::<usize>(), 40);
    assert_eq!(counts[3], (toolshield_breaker::CircuitState::ForcedOpen, 8));
}
