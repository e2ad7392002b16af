//! The retry budget's bound under load (docs/retry.md, "Retry budget"): over `t` seconds
//! with `n` calls, retries stay below `ratio × n + min_per_sec × t + burst`, whatever the
//! arrival times, the failure mix and the number of clones the calls go through. tower's
//! `Budget` promises the same shape (a deposit per request, a withdrawal per retry). A
//! randomized checker over seeded runs on tokio's paused clock, so a failing seed replays
//! exactly.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::read_request;
use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{ErrorKind, ToolError, ToolResponse};
use toolshield_retry::{BackoffStrategy, RetryBudget, RetryLayer};
use toolshield_test::{counting_tool, Rng};
use tower::{Layer, ServiceExt};

const SEEDS: u64 = 12;
const CALLS: usize = 300;

#[tokio::test(start_paused = true)]
async fn retries_never_exceed_ratio_times_calls_plus_the_floor_plus_the_burst() {
    for seed in 0..SEEDS {
        let mut rng = Rng::new(seed);
        let ratio = [0.05, 0.2, 0.5][rng.below(3) as usize];
        let min_per_sec = [0u32, 1, 10][rng.below(3) as usize];
        let burst = [1u32, 5, 50][rng.below(3) as usize];
        // Per mille of attempts that fail, retriably.
        let fail_per_mille = [500u64, 900, 1000][rng.below(3) as usize];
        let created = Instant::now();
        let budget = Arc::new(RetryBudget::new(ratio, min_per_sec, burst));

        let calls = Arc::new(AtomicUsize::new(0));
        let tool = counting_tool(&calls, Duration::from_millis(5), move |n| {
            // A fixed pseudo-random verdict per attempt number.
            let mut r = Rng::new(seed.wrapping_mul(1_000_003) ^ n as u64);
            if r.below(1000) < fail_per_mille {
                Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
            } else {
                Ok(ToolResponse::new(json!({"n": n})))
            }
        });
        let layer = RetryLayer::new(4)
            .with_backoff(BackoffStrategy::fixed_range(
                Duration::ZERO,
                Duration::from_millis(200),
            ))
            .with_budget(budget.clone());
        // A few services built from the layer, each cloned per call.
        let services: Vec<_> = (0..3).map(|_| layer.layer(tool.clone())).collect();

        let mut tasks = Vec::with_capacity(CALLS);
        for i in 0..CALLS {
            let at = rng.millis(5_000);
            let svc = services[i % services.len()].clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(at).await;
                let _ = svc.oneshot(read_request()).await;
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }

        let retries = calls.load(Ordering::SeqCst) - CALLS;
        let t = created.elapsed().as_secs_f64();
        let bound = ratio * CALLS as f64 + f64::from(min_per_sec) * t + f64::from(burst);
        assert!(
            retries as f64 <= bound,
            "seed {seed}: {retries} retries > {bound:.1} (ratio {ratio}, floor {min_per_sec}/s, \
             burst {burst}, {t:.2} s)"
        );
        assert!(
            retries <= 3 * CALLS,
            "seed {seed}: more retries than attempts allow"
        );
    }
}
