//! A waiting call's turn is an instant, reserved in `call`: a future its caller first
//! polls later than that (a busy executor, a `Buffer`, a join of several calls) starts at
//! its turn, not a whole wait after the first poll, so it never starts past its deadline
//! nor within one interval of the call reserved after it. Paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, Instant};
use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use toolshield_ratelimit::{RateLimit, RateLimitLayer};
use tower::{service_fn, Layer, Service, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_waiter_first_polled_late_starts_at_its_reserved_turn_within_its_deadline() {
    let t0 = Instant::now();
    let starts: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let seen = Arc::clone(&starts);
    let layer = RateLimitLayer::new(RateLimit::new(1, Duration::from_secs(1), 1))
        .wait_up_to(Duration::from_secs(10));
    let mut svc = layer.layer(service_fn(move |req: ToolRequest| {
        let n = req.payload()["n"].as_u64().unwrap_or(0);
        let seen = Arc::clone(&seen);
        async move {
            seen.lock().expect("starts").push((n, Instant::now()));
            Ok::<_, ToolError>(ToolResponse::new(json!(n)))
        }
    }));
    // The first call takes the only turn of this second.
    svc.ready().await.expect("ready");
    assert!(svc
        .call(ToolRequest::new("t", json!({"n": 1})))
        .await
        .is_ok());
    // The second reserves the turn at 1 s, with a deadline at 1.5 s; its caller first
    // polls it 800 ms later.
    svc.ready().await.expect("ready");
    let second = svc
        .call(ToolRequest::new("t", json!({"n": 2})).deadline(t0 + Duration::from_millis(1_500)));
    // A third is reserved the turn after (at 2 s).
    let third = tokio::spawn(svc.clone().oneshot(ToolRequest::new("t", json!({"n": 3}))));
    sleep(Duration::from_millis(800)).await;
    assert!(second.await.is_ok());
    assert!(third.await.expect("third").is_ok());
    let at = |n: u64| {
        starts
            .lock()
            .expect("starts")
            .iter()
            .find(|(m, _)| *m == n)
            .map(|(_, i)| *i - t0)
            .expect("ran")
    };
    assert_eq!(
        at(2),
        Duration::from_secs(1),
        "the second call starts at its turn"
    );
    assert!(
        at(2) <= Duration::from_millis(1_500),
        "never past its deadline"
    );
    assert!(
        at(3) - at(2) >= Duration::from_secs(1),
        "never over the rate"
    );
}
