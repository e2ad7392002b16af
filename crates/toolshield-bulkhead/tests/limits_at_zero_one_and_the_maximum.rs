//! Limits and durations at zero, one and the largest values a type holds: the builder
//! clamps them as documented, a configuration lists them as problems, and no call ever
//! panics (`Instant + Duration` included). Paused clock.

mod support;

use support::{gated, req, settle};

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use toolshield_bulkhead::{BulkheadConfig, BulkheadKey, BulkheadLayer, ByCaller, MAX_CONCURRENT};
use toolshield_core::ErrorKind;
use toolshield_test::problem_fields;
use tower::{Layer, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_limit_of_zero_is_one_and_one_admits_exactly_one() {
    for max in [0, 1] {
        let gate = Arc::new(Semaphore::new(0));
        let layer = BulkheadLayer::new(max);
        assert_eq!(layer.stats().max_concurrent(), 1, "new({max})");
        let svc = layer.layer(gated(Arc::clone(&gate)));
        let first = tokio::spawn(svc.clone().oneshot(req()));
        settle().await;
        let err = svc.clone().oneshot(req()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Overloaded, "new({max})");
        gate.add_permits(1);
        assert!(first.await.unwrap().is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn the_largest_limits_and_waits_are_clamped_and_never_panic() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(usize::MAX).with_queue(usize::MAX, Duration::MAX);
    assert_eq!(layer.stats().max_concurrent(), MAX_CONCURRENT);
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let running: Vec<_> = (0..3)
        .map(|_| tokio::spawn(svc.clone().oneshot(req())))
        .collect();
    settle().await;
    gate.add_permits(3);
    for r in running {
        assert!(r.await.unwrap().is_ok());
    }

    // One slot, the longest queue and wait: a queued call waits, and is admitted when the
    // slot frees, however far its queue timeout lies.
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).with_queue(usize::MAX, Duration::MAX);
    let stats = layer.stats();
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let first = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    // A deadline as far as an `Instant` goes is no deadline at all.
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let queued = tokio::spawn(svc.clone().oneshot(req().deadline(far)));
    settle().await;
    assert_eq!(stats.snapshot().queued, 1);
    tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
    gate.add_permits(2);
    assert!(first.await.unwrap().is_ok());
    assert!(queued.await.unwrap().is_ok());
    let s = stats.snapshot();
    assert_eq!(
        (s.admitted, s.rejected, s.in_flight, s.queued),
        (2, 0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_queue_with_no_time_to_wait_rejects_at_once() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).with_queue(5, Duration::ZERO);
    let stats = layer.stats();
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let first = tokio::spawn(svc.clone().oneshot(req()));
    settle().await;
    let start = Instant::now();
    let err = svc.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(stats.snapshot().queued, 0);
    // A deadline of one nanosecond from now leaves one nanosecond in the queue at most.
    let svc2 = BulkheadLayer::new(1)
        .with_queue(5, Duration::from_secs(1))
        .layer(gated(Arc::clone(&gate)));
    let holder = tokio::spawn(svc2.clone().oneshot(req()));
    settle().await;
    let start = Instant::now();
    let err = svc2
        .clone()
        .oneshot(req().deadline(start + Duration::from_nanos(1)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert!(
        start.elapsed() <= Duration::from_millis(1),
        "{:?}",
        start.elapsed()
    );
    gate.add_permits(2);
    assert!(first.await.unwrap().is_ok());
    assert!(holder.await.unwrap().is_ok());
}

#[test]
fn config_at_zero_and_past_the_maximum_lists_every_problem() {
    let bad = BulkheadConfig {
        max_concurrent: 0,
        max_queue: usize::MAX,
        queue_timeout: Duration::MAX,
        key: BulkheadKey::Caller,
        max_keys: 0,
    };
    let err = bad.validate().unwrap_err();
    let fields = problem_fields(&err);
    for f in ["max_concurrent", "max_queue", "queue_timeout", "max_keys"] {
        assert!(fields.contains(&f), "{f} missing from {err}");
    }
    assert!(BulkheadLayer::from_config(&bad).is_err());

    let over = BulkheadConfig {
        max_concurrent: MAX_CONCURRENT + 1,
        max_keys: usize::MAX,
        ..BulkheadConfig::default()
    };
    let err = over.validate().unwrap_err();
    let fields = problem_fields(&err);
    assert!(fields.contains(&"max_concurrent"), "{err}");
    assert!(fields.contains(&"max_keys"), "{err}");

    let zero_wait = BulkheadConfig {
        max_queue: 1,
        queue_timeout: Duration::ZERO,
        ..BulkheadConfig::default()
    };
    assert_eq!(
        problem_fields(&zero_wait.validate().unwrap_err()),
        ["queue_timeout"]
    );

    let edges = BulkheadConfig {
        max_concurrent: MAX_CONCURRENT,
        max_queue: toolshield_bulkhead::MAX_QUEUE,
        queue_timeout: toolshield_contract::config::MAX_DURATION,
        key: BulkheadKey::Run,
        max_keys: 1,
    };
    assert!(
        edges.validate().is_ok(),
        "the largest accepted values are valid"
    );
    assert!(BulkheadLayer::from_config(&edges).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_key_bound_of_zero_holds_one_key() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).keyed(ByCaller, 0);
    let stats = layer.stats();
    let svc = layer.layer(gated(Arc::clone(&gate)));
    let a = tokio::spawn(svc.clone().oneshot(req().caller("a")));
    settle().await;
    assert_eq!(stats.snapshot().keys, 1);
    let err = svc.clone().oneshot(req().caller("b")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    gate.add_permits(2);
    assert!(a.await.unwrap().is_ok());
    assert!(svc.clone().oneshot(req().caller("b")).await.is_ok());
}
