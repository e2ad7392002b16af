//! Memory held by the Prometheus recorder stays bounded under load while nobody scrapes
//! `/metrics`: the exporter drains histogram samples by itself (its upkeep task), so the
//! bytes held after many more calls are the same.

mod support;

use std::alloc::System;
use std::time::Duration;

use serde_json::Value;
use toolshield_core::ToolRequest;
use toolshield_metrics::{local_prometheus, DRAIN_EVERY, UPKEEP_INTERVAL};
use toolshield_test::alloc::{one_at_a_time, StatsAlloc, INSTRUMENTED_SYSTEM};
use toolshield_test::call_now;
use tower::{Service, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes held now (allocated minus freed).
fn held() -> i64 {
    let s = GLOBAL.stats();
    let grown = i64::try_from(s.bytes_allocated).unwrap_or(i64::MAX)
        - i64::try_from(s.bytes_deallocated).unwrap_or(i64::MAX);
    grown + i64::try_from(s.bytes_reallocated).unwrap_or(0)
}

#[test]
fn recorder_memory_stays_bounded_without_scrapes() {
    // The allocator counts every thread: the tests of this file measure one at a time.
    let _one_at_a_time = one_at_a_time();
    const PER_SECOND: u64 = 10_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let exporter = local_prometheus();
        let mut svc = support::metered(&exporter);
        let req = ToolRequest::new("weather", Value::Null);

        let mut calls = 0u64;
        let mut run_seconds = async |seconds: u64| {
            for _ in 0..seconds {
                for _ in 0..PER_SECOND {
                    svc.ready().await.unwrap().call(req.clone()).await.unwrap();
                }
                calls += PER_SECOND;
                tokio::time::advance(Duration::from_secs(1)).await;
                tokio::task::yield_now().await;
            }
        };
        // Warm up over two upkeep periods, then measure at the same point of the period.
        let period = UPKEEP_INTERVAL.as_secs();
        run_seconds(2 * period).await;
        let before = held();
        run_seconds(6 * period).await;
        let growth = held() - before;

        // Without upkeep every sample (16 bytes and more) waits for a render:
        // 6 x 5 x 10,000 samples would hold about 5 MB.
        assert!(
            growth < 512 * 1024,
            "{growth} bytes more held after {} more calls",
            6 * period * PER_SECOND
        );
        assert!(exporter.upkeep_running());

        // Nothing drained was lost.
        assert_eq!(
            support::successes(&exporter.render(), "weather"),
            Some(calls as f64)
        );
    });
}

#[test]
fn recorder_memory_stays_bounded_when_the_upkeep_task_never_runs() {
    // Calls polled by hand, outside any runtime: no upkeep task starts, and none could
    // run (a caller that never yields, a `block_on` per call on calls that complete at
    // once). Histogram samples are drained every DRAIN_EVERY of them all the same.
    let _one_at_a_time = one_at_a_time();
    let exporter = local_prometheus();
    let mut svc = support::metered(&exporter);
    let req = ToolRequest::new("weather", Value::Null);
    let mut run = |calls: u64| {
        for _ in 0..calls {
            call_now(&mut svc, req.clone()).unwrap();
        }
    };
    // Warm up, then measure at the same point of the drain period.
    run(2 * DRAIN_EVERY);
    let before = held();
    run(6 * DRAIN_EVERY);
    let growth = held() - before;
    assert!(!exporter.upkeep_running(), "no runtime, no upkeep task");
    // Without the drain, 6 x 65,536 samples of 16 bytes and more: over 6 MB.
    assert!(
        growth < 512 * 1024,
        "{growth} bytes more held after {} more calls",
        6 * DRAIN_EVERY
    );
    assert_eq!(
        support::successes(&exporter.render(), "weather"),
        Some((8 * DRAIN_EVERY) as f64),
        "nothing drained was lost"
    );
}
