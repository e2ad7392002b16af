//! Unbounded durations: a config rejects them with every other problem, a builder clamps
//! them to `MAX_DURATION`, and no call panics on them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, Instant};
use toolshield_core::config::MAX_DURATION;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::problem_fields;
use toolshield_timeout::{DeadlineLayer, TimeoutConfig, TimeoutLayer};
use tower::{service_fn, Layer, Service, ServiceExt};

#[test]
fn validate_reports_every_unbounded_duration_with_the_other_problems() {
    let cfg: TimeoutConfig =
        serde_json::from_str(r#"{"attempt": "300000000000years", "soft": "0s"}"#).unwrap();
    let err = cfg.validate().unwrap_err();
    assert_eq!(problem_fields(&err), ["attempt", "soft"], "{err}");
    assert!(
        err.problems()[0]
            .message
            .contains("longer than the longest duration accepted"),
        "{err}"
    );
    assert!(TimeoutLayer::from_config(&cfg).is_err());
    assert!(DeadlineLayer::from_config(&cfg).is_err());

    let cfg = TimeoutConfig {
        attempt: Duration::ZERO,
        soft: None,
        total: Some(Duration::MAX),
        idle: None,
    };
    let err = cfg.validate().unwrap_err();
    assert_eq!(problem_fields(&err), ["attempt", "total"], "{err}");

    let cfg = TimeoutConfig {
        attempt: Duration::MAX,
        soft: Some(Duration::MAX),
        total: None,
        idle: None,
    };
    let err = cfg.validate().unwrap_err();
    // Both too long, and the soft threshold is not below the attempt timeout.
    assert_eq!(problem_fields(&err), ["attempt", "soft", "soft"], "{err}");

    let at_the_bound = TimeoutConfig {
        attempt: MAX_DURATION,
        soft: Some(Duration::from_secs(1)),
        total: Some(MAX_DURATION),
        idle: Some(MAX_DURATION),
    };
    assert!(at_the_bound.validate().is_ok());

    let cfg = TimeoutConfig {
        attempt: MAX_DURATION,
        soft: None,
        total: None,
        idle: Some(Duration::MAX),
    };
    let err = cfg.validate().unwrap_err();
    // Too long, and longer than the attempt timeout.
    assert_eq!(problem_fields(&err), ["idle", "idle"], "{err}");
}

#[tokio::test(start_paused = true)]
async fn an_attempt_timeout_of_duration_max_is_clamped_and_expires() {
    let mut svc = TimeoutLayer::new(Duration::MAX)
        .soft_threshold(Duration::MAX)
        .layer(service_fn(|_req: ToolRequest| async {
            std::future::pending::<()>().await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }));
    let start = Instant::now();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), MAX_DURATION);
}

#[tokio::test(start_paused = true)]
async fn a_call_under_duration_max_limits_completes_with_a_bounded_deadline() {
    let seen = Arc::new(Mutex::new(None));
    let s = Arc::clone(&seen);
    let tool = service_fn(move |req: ToolRequest| {
        *s.lock().unwrap() = req.deadline_at();
        async {
            sleep(Duration::from_secs(1)).await; // paused clock
            Ok::<_, ToolError>(ToolResponse::new(json!("done")))
        }
    });
    let svc = tower::ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::MAX))
        .layer(TimeoutLayer::new(Duration::MAX).soft_threshold(Duration::MAX))
        .service(tool);
    let start = Instant::now();
    let res = svc
        .oneshot(ToolRequest::new("t", json!(null)))
        .await
        .unwrap();
    assert_eq!(res.output, json!("done"));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(*seen.lock().unwrap(), Some(start + MAX_DURATION));
}

#[tokio::test(start_paused = true)]
async fn an_idle_limit_of_duration_max_is_clamped_and_the_hard_maximum_holds() {
    let start = tokio::time::Instant::now();
    let err = TimeoutLayer::new(Duration::from_secs(5))
        .idle(Duration::MAX)
        .layer(service_fn(|_req: ToolRequest| async {
            std::future::pending::<()>().await;
            Ok::<_, ToolError>(ToolResponse::new(json!(null)))
        }))
        .oneshot(ToolRequest::new("t", json!(null)))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(err.message().contains("attempt exceeded 5s"), "{err}");
}
