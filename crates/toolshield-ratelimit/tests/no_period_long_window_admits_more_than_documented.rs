//! The documented bound on any window one period long (`burst + rate - 1` calls, exactly
//! `rate` with `burst = 1`), checked against calls arriving at random times, in reject and
//! in wait mode; and limits at zero, one and the largest values: a configuration lists
//! every problem, a call never panics, and a call whose deadline has passed never waits.
//! Paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{OnLimit, RateLimit, RateLimitConfig, RateLimitLayer};
use toolshield_test::problem_fields;
use toolshield_test::Rng;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// A tool that records the instant each call starts.
fn recording(starts: Arc<Mutex<Vec<Instant>>>) -> Svc {
    BoxCloneService::new(service_fn(move |_req: ToolRequest| {
        starts.lock().unwrap().push(Instant::now());
        async { Ok::<_, ToolError>(ToolResponse::new(json!("ok"))) }
    }))
}

/// The clock's step while calls arrive.
const STEP: Duration = Duration::from_millis(1);

fn req() -> ToolRequest {
    ToolRequest::new("search", json!({}))
}

/// The most starts in any window `[t, t + period)`.
fn busiest_window(starts: &[Instant], period: Duration) -> usize {
    let mut most = 0;
    for (i, t) in starts.iter().enumerate() {
        let n = starts[i..].iter().take_while(|s| **s < *t + period).count();
        most = most.max(n);
    }
    most
}

#[tokio::test(start_paused = true)]
async fn random_arrivals_never_put_more_than_burst_plus_rate_minus_one_calls_in_one_period() {
    let period = Duration::from_secs(1);
    for (seed, rate, burst, wait) in [
        (1, 5, 1, false),
        (2, 5, 5, false),
        (3, 7, 3, false),
        (4, 3, 1, true),
        (5, 4, 4, true),
        (6, 10, 2, true),
    ] {
        let mut rng = Rng::new(seed);
        let starts = Arc::new(Mutex::new(Vec::new()));
        let layer = RateLimitLayer::new(RateLimit::new(rate, period, burst));
        let layer = if wait {
            layer.wait_up_to(Duration::from_millis(700))
        } else {
            layer
        };
        let svc = layer.layer(recording(Arc::clone(&starts)));
        let mut tasks = Vec::new();
        let begin = Instant::now();
        // Bursts of calls at random instants over 20 periods.
        while begin.elapsed() < period * 20 {
            for _ in 0..=rng.below(4) {
                tasks.push(tokio::spawn(svc.clone().oneshot(req())));
            }
            // In steps of 1 ms: a waiter starts within 1 ms of its turn.
            for _ in 0..rng.below(150) {
                tokio::time::advance(STEP).await;
            }
        }
        tokio::time::advance(period * 2).await;
        for t in tasks {
            if let Err(e) = t.await.unwrap() {
                assert_eq!(e.kind(), ErrorKind::RateLimited);
            }
        }
        let mut starts = starts.lock().unwrap().clone();
        starts.sort();
        let bound = (burst + rate - 1) as usize;
        // Windows 1 ms short of a period: a start is seen up to one step after its turn.
        let most = busiest_window(&starts, period - STEP);
        assert!(
            most <= bound,
            "rate {rate} burst {burst} wait {wait}: {most} calls in one period, bound {bound}"
        );
        assert!(
            starts.len() >= 20 * rate as usize / 2,
            "the limiter admitted calls"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_of_one_admits_exactly_one_call_per_period() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .layer(recording(Arc::clone(&starts)));
    for _ in 0..5_000 {
        let _ = svc.clone().oneshot(req()).await;
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 5);
    for pair in starts.windows(2) {
        assert_eq!(pair[1] - pair[0], Duration::from_secs(1));
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_has_passed_never_waits() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let svc = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .wait_up_to(Duration::MAX)
        .layer(recording(Arc::clone(&starts)));
    assert!(svc.clone().oneshot(req()).await.is_ok());
    let now = Instant::now();
    for deadline in [now, now + Duration::from_nanos(1)] {
        let err = svc
            .clone()
            .oneshot(req().deadline(deadline))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RateLimited);
        assert_eq!(Instant::now(), now, "refused without waiting");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    }
    // Nothing was reserved by the refused calls: the next turn is still one period on.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(svc.clone().oneshot(req()).await.is_ok());
    assert_eq!(starts.lock().unwrap().len(), 2);
    // A deadline as far as an `Instant` goes, and the longest wait: no panic, a wait of
    // one interval.
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let before = Instant::now();
    assert!(svc.clone().oneshot(req().deadline(far)).await.is_ok());
    assert_eq!(before.elapsed(), Duration::from_secs(1));
}

#[test]
fn config_at_zero_and_past_the_maximum_lists_every_problem() {
    let bad = RateLimitConfig {
        rate: 0,
        period: Duration::ZERO,
        burst: Some(0),
        on_limit: OnLimit::Wait,
        max_wait: Duration::ZERO,
        max_keys: 0,
        ..RateLimitConfig::default()
    };
    let err = bad.validate().unwrap_err();
    let fields = problem_fields(&err);
    for f in ["rate", "period", "burst", "max_wait", "max_keys"] {
        assert!(fields.contains(&f), "{f} missing from {err}");
    }
    assert!(RateLimitLayer::from_config(&bad).is_err());

    let huge = RateLimitConfig {
        rate: u32::MAX,
        period: Duration::MAX,
        burst: Some(u32::MAX),
        on_limit: OnLimit::Wait,
        max_wait: Duration::MAX,
        max_keys: u64::MAX,
        ..RateLimitConfig::default()
    };
    let err = huge.validate().unwrap_err();
    let fields = problem_fields(&err);
    for f in ["period", "max_wait", "max_keys"] {
        assert!(fields.contains(&f), "{f} missing from {err}");
    }
    // Faster than one call per microsecond is refused.
    let fast = RateLimitConfig {
        rate: 2_000,
        period: Duration::from_millis(1),
        ..RateLimitConfig::default()
    };
    assert_eq!(problem_fields(&fast.validate().unwrap_err()), ["rate"]);
    // A burst whose tolerance passes the longest duration is refused.
    let long_burst = RateLimitConfig {
        rate: 1,
        period: Duration::from_secs(24 * 3600),
        burst: Some(400),
        ..RateLimitConfig::default()
    };
    assert_eq!(
        problem_fields(&long_burst.validate().unwrap_err()),
        ["burst"]
    );
}
