//! The limit per period at its edges: a rate that does not divide its period, calls
//! spaced exactly by the `retry_after` they were given, zero and huge periods, and a
//! wait longer than `max_wait` refused at once.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{RateLimit, RateLimitLayer};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;
type Limited = toolshield_ratelimit::RateLimiter<Svc>;

fn tool() -> Svc {
    BoxCloneService::new(service_fn(|_req: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
    }))
}

fn req() -> ToolRequest {
    ToolRequest::new("search", json!({}))
}

/// Calls as fast as the limiter allows (each rejected call waits exactly its
/// `retry_after`) until `window` has passed; the times of the admitted calls.
async fn admitted_within(svc: &Limited, window: Duration) -> Vec<Duration> {
    let start = Instant::now();
    let mut admitted = Vec::new();
    while Instant::now() - start < window {
        match svc.clone().oneshot(req()).await {
            Ok(_) => admitted.push(Instant::now() - start),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::RateLimited);
                let wait = e.retry_after().expect("a rate-limit rejection says when");
                assert!(!wait.is_zero(), "a rejection never asks for no wait");
                tokio::time::advance(wait).await;
            }
        }
    }
    admitted
}

#[tokio::test(start_paused = true)]
async fn a_rate_that_does_not_divide_its_period_never_admits_more_than_rate_calls_per_period() {
    // 3 per second without a burst: never a fourth call within one second, even by
    // a caller that comes back exactly when `retry_after` says.
    let svc = RateLimitLayer::new(RateLimit::new(3, Duration::from_secs(1), 1)).layer(tool());
    let admitted = admitted_within(&svc, Duration::from_secs(1)).await;
    assert_eq!(admitted.len(), 3, "admitted at {admitted:?}");
    // And over ten periods, at most one more than 3 per period, each call at least
    // a third of a second after the one before.
    let svc = RateLimitLayer::new(RateLimit::new(7, Duration::from_secs(1), 1)).layer(tool());
    let admitted = admitted_within(&svc, Duration::from_secs(10)).await;
    assert_eq!(admitted.len(), 70, "admitted {} calls", admitted.len());
    for pair in admitted.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(1) / 7,
            "calls {:?} apart, closer than 1/7 s",
            pair[1] - pair[0]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_burst_and_the_steady_rate_never_pass_twice_the_rate_in_one_period() {
    // GCRA with burst = rate: the burst, then one per interval; in any period-long
    // window at most 2 * rate - 1 calls (a fixed window would allow 2 * rate).
    let svc = RateLimitLayer::new(RateLimit::new(3, Duration::from_secs(1), 3)).layer(tool());
    let admitted = admitted_within(&svc, Duration::from_secs(1)).await;
    assert_eq!(admitted.len(), 5, "admitted at {admitted:?}");
}

#[tokio::test(start_paused = true)]
async fn zero_and_huge_periods_and_waits_never_panic() {
    let limits = [
        RateLimit::new(0, Duration::ZERO, 0),
        RateLimit::new(u32::MAX, Duration::ZERO, u32::MAX),
        RateLimit::new(1, Duration::MAX, 1),
        RateLimit::new(1, Duration::MAX, u32::MAX),
        RateLimit::new(u32::MAX, Duration::MAX, u32::MAX),
    ];
    for limit in limits {
        for wait in [None, Some(Duration::ZERO), Some(Duration::MAX)] {
            let layer = RateLimitLayer::new(limit);
            let layer = match wait {
                Some(w) => layer.wait_up_to(w),
                None => layer,
            };
            let svc = layer.layer(tool());
            for _ in 0..3 {
                let out =
                    tokio::time::timeout(Duration::from_secs(1), svc.clone().oneshot(req())).await;
                if let Ok(Err(e)) = out {
                    assert_eq!(e.kind(), ErrorKind::RateLimited, "{limit:?}");
                }
            }
            tokio::time::advance(Duration::from_secs(400 * 24 * 3600)).await;
            let out =
                tokio::time::timeout(Duration::from_secs(1), svc.clone().oneshot(req())).await;
            assert!(
                matches!(out, Ok(Ok(_))),
                "{limit:?}: a call after a long idle time is admitted"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_max_wait_is_refused_at_once_with_the_whole_wait() {
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(10), 1))
        .wait_up_to(Duration::from_secs(2))
        .layer(tool());
    assert!(svc.clone().oneshot(req()).await.is_ok());
    let before = Instant::now();
    let err = svc.clone().oneshot(req()).await.unwrap_err();
    assert_eq!(before.elapsed(), Duration::ZERO, "refused without waiting");
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(10)));
    assert!(err.is_retriable());
}
