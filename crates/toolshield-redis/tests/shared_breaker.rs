//! Shared breaker open-state: two stacks on one Redis; tripping the breaker in one makes the
//! other reject with `CIRCUIT_OPEN` for the open period, with no Redis round trip on the
//! closed-state call path.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{connect, prefix};
use serde_json::json;
use tokio::time::Instant;
use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_redis::testing::test_redis;
use toolshield_redis::SharedBreakerState;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

const OPEN_WAIT: Duration = Duration::from_millis(800);

type Stack = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

fn registry() -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 3,
        open_wait: OPEN_WAIT,
        ..BreakerConfig::default()
    })
    .unwrap()
}

/// A stack whose tool fails while `failing` says so, counting its calls.
fn stack(registry: &BreakerRegistry, calls: Arc<AtomicUsize>, failing: bool) -> Stack {
    let tool = service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if failing {
                Err(ToolError::new(
                    ErrorKind::UpstreamUnavailable,
                    "payments api down",
                ))
            } else {
                Ok(ToolResponse::new(json!({"ok": true})))
            }
        }
    });
    BoxCloneService::new(BreakerLayer::new(registry.clone()).layer(tool))
}

fn req() -> ToolRequest {
    ToolRequest::new("payments", json!({"amount": 1}))
}

async fn until<F: FnMut() -> bool>(within: Duration, what: &str, mut f: F) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tripping_one_stack_opens_the_key_in_the_other_for_the_open_period() {
    let Some(redis) =
        test_redis("tripping_one_stack_opens_the_key_in_the_other_for_the_open_period")
    else {
        return;
    };
    let prefix = prefix();
    let conn_a = connect(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let conn_b = connect(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let (reg_a, reg_b) = (registry(), registry());
    let shared_a = SharedBreakerState::attach(&reg_a, conn_a, "payments-fleet")
        .await
        .unwrap();
    let shared_b = SharedBreakerState::attach(&reg_b, conn_b.clone(), "payments-fleet")
        .await
        .unwrap();
    let (calls_a, calls_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = stack(&reg_a, Arc::clone(&calls_a), true);
    let b = stack(&reg_b, Arc::clone(&calls_b), false);

    // B is closed and healthy; its calls cost no Redis round trip.
    let before = conn_b.round_trips();
    for _ in 0..100 {
        b.clone().oneshot(req()).await.unwrap();
    }
    assert_eq!(
        conn_b.round_trips(),
        before,
        "no Redis round trip on the closed-state path"
    );
    assert_eq!(calls_b.load(Ordering::SeqCst), 100);

    // A trips.
    for _ in 0..3 {
        let e = a.clone().oneshot(req()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UpstreamUnavailable);
    }
    let opened = Instant::now();
    assert_eq!(reg_a.state("payments"), CircuitState::Open);
    until(Duration::from_secs(2), "propagation to B", || {
        shared_b.open_elsewhere("payments").is_some()
    })
    .await;
    assert!(
        shared_a.open_elsewhere("payments").is_none(),
        "A does not echo its own opening"
    );

    // B rejects without calling its tool, with the time left as retry_after.
    let b_calls = calls_b.load(Ordering::SeqCst);
    let e = b.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CircuitOpen, "{e}");
    let wait = e.retry_after().expect("retry_after");
    assert!(
        wait <= OPEN_WAIT && wait > OPEN_WAIT / 4,
        "retry_after {wait:?}"
    );
    assert_eq!(
        calls_b.load(Ordering::SeqCst),
        b_calls,
        "B's tool must not run"
    );
    assert_eq!(reg_b.rejections("payments"), 1);
    // Other keys of B are not affected.
    b.clone()
        .oneshot(ToolRequest::new("weather", json!({})))
        .await
        .unwrap();

    // After the open period B admits again.
    until(OPEN_WAIT * 3, "the end of the open period", || {
        shared_b.open_elsewhere("payments").is_none()
    })
    .await;
    assert!(
        opened.elapsed() >= OPEN_WAIT / 2,
        "B stayed open for the open period"
    );
    b.clone().oneshot(req()).await.unwrap();
    assert_eq!(calls_b.load(Ordering::SeqCst), b_calls + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_attaching_during_an_open_period_learns_of_it() {
    let Some(redis) = test_redis("a_process_attaching_during_an_open_period_learns_of_it") else {
        return;
    };
    let prefix = prefix();
    let reg_a = registry();
    let _shared_a = SharedBreakerState::attach(
        &reg_a,
        connect(&redis.url(), &prefix, Duration::from_secs(1)).await,
        "fleet",
    )
    .await
    .unwrap();
    let a = stack(&reg_a, Arc::new(AtomicUsize::new(0)), true);
    for _ in 0..3 {
        let _ = a.clone().oneshot(req()).await;
    }
    assert_eq!(reg_a.state("payments"), CircuitState::Open);

    // A third process starts now: the publication may still be on its way, so poll.
    let conn_c = connect(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let reg_c = registry();
        let shared_c = SharedBreakerState::attach(&reg_c, conn_c.clone(), "fleet")
            .await
            .unwrap();
        if shared_c.open_elsewhere("payments").is_some() {
            let c = stack(&reg_c, Arc::new(AtomicUsize::new(0)), false);
            let e = c.oneshot(req()).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::CircuitOpen);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the snapshot never showed the open key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The breaker hook itself, without Redis: only a closed breaker in normal mode asks it.
#[tokio::test]
async fn the_hook_rejects_only_closed_breakers_in_normal_mode() {
    struct OpenForX;
    impl toolshield_breaker::SharedOpenState for OpenForX {
        fn open_for(&self, key: &str) -> Option<Duration> {
            (key == "x").then_some(Duration::from_secs(7))
        }
    }
    let reg = registry();
    assert!(reg.share_open_state(Arc::new(OpenForX)));
    assert!(!reg.share_open_state(Arc::new(OpenForX)), "set once");
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = stack(&reg, Arc::clone(&calls), false);
    let x = || ToolRequest::new("x", json!({}));

    let e = svc.clone().oneshot(x()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CircuitOpen);
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    svc.clone()
        .oneshot(ToolRequest::new("y", json!({})))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    reg.metrics_only("x");
    svc.clone().oneshot(x()).await.unwrap();
    reg.force_closed("x");
    svc.clone().oneshot(x()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// An operator's reset in one process reaches the others: the process that reset admits
/// at once, a process whose own breaker tripped is reset too (without announcing it
/// again), an override set elsewhere stays, and a process starting later finds nothing
/// open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_reset_reaches_every_process() {
    let Some(redis) = test_redis("a_manual_reset_reaches_every_process") else {
        return;
    };
    let prefix = prefix();
    // An open period far longer than the test: only the reset can end it.
    let long = || {
        BreakerRegistry::new(BreakerConfig {
            consecutive_failures: 3,
            open_wait: Duration::from_secs(120),
            ..BreakerConfig::default()
        })
        .unwrap()
    };
    let url = redis.url();
    let conn = || connect(&url, &prefix, Duration::from_secs(1));
    let (reg_a, reg_b, reg_c) = (long(), long(), long());
    let conn_a = conn().await;
    let _shared_a = SharedBreakerState::attach(&reg_a, conn_a.clone(), "fleet")
        .await
        .unwrap();
    let shared_b = SharedBreakerState::attach(&reg_b, conn().await, "fleet")
        .await
        .unwrap();
    let _shared_c = SharedBreakerState::attach(&reg_c, conn().await, "fleet")
        .await
        .unwrap();
    let a = stack(&reg_a, Arc::new(AtomicUsize::new(0)), true);
    let calls_b = Arc::new(AtomicUsize::new(0));
    let b = stack(&reg_b, Arc::clone(&calls_b), false);
    for _ in 0..3 {
        let _ = a.clone().oneshot(req()).await;
    }
    assert_eq!(reg_a.state("payments"), CircuitState::Open);
    reg_c.force_open("payments");
    until(Duration::from_secs(2), "propagation to B", || {
        shared_b.open_elsewhere("payments").is_some()
    })
    .await;
    let e = b.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CircuitOpen, "{e}");
    let a_round_trips = conn_a.round_trips();

    reg_b.reset("payments");
    // B admits at once, without waiting for its announcement to come back.
    b.clone().oneshot(req()).await.unwrap();
    assert_eq!(calls_b.load(Ordering::SeqCst), 1);
    until(Duration::from_secs(2), "the reset reaching A", || {
        reg_a.state("payments") == CircuitState::Closed
    })
    .await;
    assert_eq!(
        reg_c.state("payments"),
        CircuitState::ForcedOpen,
        "an override elsewhere stays"
    );
    // A's announcements go out in order: an opening of another key, once B has it,
    // comes after any announcement of the reset A applied, without waiting on the clock.
    for _ in 0..3 {
        let _ = a
            .clone()
            .oneshot(ToolRequest::new("refunds", json!({})))
            .await;
    }
    until(
        Duration::from_secs(2),
        "A's next opening reaching B",
        || shared_b.open_elsewhere("refunds").is_some(),
    )
    .await;
    assert_eq!(
        conn_a.round_trips(),
        a_round_trips + 1,
        "a reset applied from elsewhere is not announced again (one round trip: the opening)"
    );
    // The opening is gone from Redis: a process starting now finds nothing open.
    let reg_d = long();
    let shared_d = SharedBreakerState::attach(&reg_d, conn().await, "fleet")
        .await
        .unwrap();
    assert!(shared_d.open_elsewhere("payments").is_none());
    b.clone().oneshot(req()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_under_the_registry_key_does_not_stop_sharing_for_good() {
    let Some(redis) =
        test_redis("a_foreign_value_under_the_registry_key_does_not_stop_sharing_for_good")
    else {
        return;
    };
    let prefix = prefix();
    // Another client wrote a string where the registry's hash lives.
    let mut raw = redis::Client::open(redis.url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}breaker:{{fleet}}"))
        .arg("not a hash")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reg_a = registry();
    let _shared_a = SharedBreakerState::attach(
        &reg_a,
        connect(&redis.url(), &prefix, Duration::from_secs(1)).await,
        "fleet",
    )
    .await
    .unwrap();
    let a = stack(&reg_a, Arc::new(AtomicUsize::new(0)), true);
    for _ in 0..3 {
        let _ = a.clone().oneshot(req()).await;
    }
    assert_eq!(reg_a.state("payments"), CircuitState::Open);
    // A process attaching now still learns of the opening: the value in the way was
    // replaced by the registry's own.
    let conn_c = connect(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let reg_c = registry();
        let attached = SharedBreakerState::attach(&reg_c, conn_c.clone(), "fleet").await;
        if let Ok(shared_c) = attached {
            if shared_c.open_elsewhere("payments").is_some() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the opening never reached a process attaching after it"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
