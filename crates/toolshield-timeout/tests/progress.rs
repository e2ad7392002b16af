//! The idle limit: progress reports reset it, the attempt timeout stays a hard maximum,
//! and a report of one attempt never keeps another alive.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{CallState, ErrorKind, ShieldRequest, ToolError, ToolRequest, ToolResponse};
use toolshield_retry::{BackoffStrategy, RetryLayer};
use toolshield_timeout::{TimeoutConfig, TimeoutLayer};
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// 60 s hard maximum, 10 s idle limit.
fn layer() -> TimeoutLayer {
    TimeoutLayer::new(secs(60)).idle(secs(10))
}

/// Reports every `every` for `reports` times, then sleeps `tail`, then answers.
fn reporter(
    every: Duration,
    reports: u32,
    tail: Duration,
) -> impl tower::Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone {
    service_fn(move |req: ToolRequest| async move {
        for i in 1..=reports {
            tokio::time::sleep(every).await;
            req.progress()
                .report(f64::from(i), None, Some(&format!("step {i}")));
        }
        tokio::time::sleep(tail).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("done")))
    })
}

#[tokio::test(start_paused = true)]
async fn a_tool_reporting_every_5s_survives_the_idle_limit_until_the_hard_maximum() {
    let svc = layer().layer(reporter(secs(5), u32::MAX, Duration::ZERO));
    let start = Instant::now();
    let err = svc
        .oneshot(ToolRequest::new("crawl", json!({})))
        .await
        .unwrap_err();
    assert_eq!(
        start.elapsed(),
        secs(60),
        "cut at the hard maximum, not before"
    );
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("attempt exceeded 60s"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_silent_tool_is_cut_at_the_idle_limit() {
    let svc = layer().layer(reporter(secs(1), 0, secs(1000)));
    let start = Instant::now();
    let err = svc
        .oneshot(ToolRequest::new("crawl", json!({})))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), secs(10));
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert!(err.is_retriable());
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_stops_reporting_is_cut_one_idle_limit_after_its_last_report() {
    // Reports at 5, 10 and 15 s, then hangs: cut at 25 s.
    let svc = layer().layer(reporter(secs(5), 3, secs(1000)));
    let start = Instant::now();
    let err = svc
        .oneshot(ToolRequest::new("crawl", json!({})))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), secs(25));
    assert!(err.message().contains("no progress for 10s"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_reporting_tool_that_finishes_within_the_maximum_succeeds() {
    // Reports at 9, 18, ..., 45 s, answers at 54 s: no gap reaches 10 s.
    let svc = layer().layer(reporter(secs(9), 5, secs(9)));
    let start = Instant::now();
    let res = svc.oneshot(ToolRequest::new("crawl", json!({}))).await;
    assert!(res.is_ok(), "{res:?}");
    assert_eq!(start.elapsed(), secs(54));
}

#[tokio::test(start_paused = true)]
async fn without_an_idle_limit_progress_changes_nothing() {
    // No idle limit: a silent 50 s call succeeds under a 60 s attempt timeout, and the
    // tool's request carries no idle clock.
    let saw_clock = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&saw_clock);
    let tool = service_fn(move |req: ToolRequest| {
        let seen = Arc::clone(&seen);
        async move {
            if req.progress().idle_clock().is_some() {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(secs(50)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("done")))
        }
    });
    let svc = TimeoutLayer::new(secs(60)).layer(tool);
    assert!(svc.oneshot(ToolRequest::new("t", json!({}))).await.is_ok());
    assert_eq!(saw_clock.load(Ordering::SeqCst), 0);
}

/// A tool whose first attempt leaves a task behind that keeps reporting on the first
/// attempt's request, forever; the tool itself hangs silently on every attempt.
#[tokio::test(start_paused = true)]
async fn a_report_from_a_previous_attempt_does_not_extend_the_next() {
    let events = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&events);
    let tool = service_fn(|req: ToolRequest| async move {
        if req.attempt() == 1 {
            let straggler = req.clone();
            tokio::spawn(async move {
                // Off the whole seconds, so no report ties with an expiry.
                tokio::time::sleep(Duration::from_millis(500)).await;
                loop {
                    straggler.progress().heartbeat();
                    tokio::time::sleep(secs(1)).await;
                }
            });
        }
        tokio::time::sleep(secs(1000)).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("late")))
    });
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new(2)
                .without_budget()
                .with_backoff(BackoffStrategy::Fixed {
                    min: secs(1),
                    max: secs(1),
                }),
        )
        .layer(layer())
        .service(tool);
    let req = ToolRequest::new("crawl", json!({}))
        .kind(toolshield_core::CallKind::ReadOnly)
        .on_progress(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
    let progress = req.progress().clone();
    let start = Instant::now();
    let err = svc.oneshot(req).await.unwrap_err();
    // attempt 1: kept alive by the straggler's heartbeats until the hard maximum (60 s);
    // 1 s backoff; attempt 2: silent, cut 10 s after it started.
    assert_eq!(start.elapsed(), secs(71));
    assert!(err.message().contains("no progress for 10s"), "{err}");
    // Reports of attempt 1 reached the caller while it ran (at 0.5, 1.5, ..., 59.5 s),
    // none after it ended.
    assert_eq!(events.load(Ordering::SeqCst), 60);
    assert_eq!(progress.reports(), 60);
}

#[tokio::test(start_paused = true)]
async fn the_callback_sees_every_report_of_every_attempt() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let tool = service_fn(|req: ToolRequest| async move {
        let p = req.progress();
        if req.attempt() == 1 {
            p.report(1.0, 2.0, Some("first try"));
            tokio::time::sleep(secs(5)).await;
            p.report(2.0, 2.0, None);
            return Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"));
        }
        for i in 1..=3 {
            tokio::time::sleep(secs(5)).await;
            p.report(f64::from(i), 3.0, Some(&format!("retry {i}")));
        }
        Ok(ToolResponse::new(json!("ok")))
    });
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new(2)
                .without_budget()
                .with_backoff(BackoffStrategy::Fixed {
                    min: secs(1),
                    max: secs(1),
                }),
        )
        .layer(layer())
        .service(tool);
    let req = ToolRequest::new("crawl", json!({}))
        .kind(toolshield_core::CallKind::ReadOnly)
        .on_progress(move |e| {
            log.lock().unwrap().push((
                e.attempt,
                e.seq,
                e.progress,
                e.total,
                e.message.map(str::to_owned),
            ));
        });
    let progress = req.progress().clone();
    let res = svc.oneshot(req).await;
    assert!(res.is_ok(), "{res:?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (1, 1, Some(1.0), Some(2.0), Some("first try".to_owned())),
            (1, 2, Some(2.0), Some(2.0), None),
            (2, 3, Some(1.0), Some(3.0), Some("retry 1".to_owned())),
            (2, 4, Some(2.0), Some(3.0), Some("retry 2".to_owned())),
            (2, 5, Some(3.0), Some(3.0), Some("retry 3".to_owned())),
        ]
    );
    assert_eq!(progress.reports(), 5);
    assert_eq!(progress.last_message().as_deref(), Some("retry 3"));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_closes_the_attempt_and_cancels_its_token() {
    let kept: Arc<Mutex<Option<ToolRequest>>> = Arc::default();
    let slot = Arc::clone(&kept);
    let tool = service_fn(move |req: ToolRequest| {
        *slot.lock().unwrap() = Some(req);
        async {
            tokio::time::sleep(secs(1000)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("late")))
        }
    });
    let req = ToolRequest::new("crawl", json!({})).on_progress(|_| {});
    let progress = req.progress().clone();
    let svc = layer().layer(tool);
    let call = tokio::spawn(svc.oneshot(req));
    tokio::time::sleep(secs(3)).await;
    let attempt = kept.lock().unwrap().clone().expect("the tool was called");
    attempt.progress().heartbeat();
    assert_eq!(progress.reports(), 1);
    call.abort();
    let _ = call.await;
    // The attempt is over: its token is cancelled, its reports go nowhere.
    assert!(attempt.attempt_token().is_cancelled());
    assert!(attempt
        .progress()
        .idle_clock()
        .is_some_and(|c| c.is_closed()));
    attempt.progress().report(1.0, None, Some("after the end"));
    assert_eq!(progress.reports(), 1);
    assert_eq!(progress.last_message(), None);
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_before_the_maximum_still_cuts_a_reporting_tool() {
    let svc = layer().layer(reporter(secs(5), u32::MAX, Duration::ZERO));
    let start = Instant::now();
    let req = ToolRequest::new("crawl", json!({})).deadline(start + secs(22));
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(start.elapsed(), secs(22));
    assert!(err.message().contains("deadline"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn any_request_type_reports_through_its_call_state() {
    // An `http::Request` carries its state in the extensions; the tool reports there.
    let tool = service_fn(|req: http::Request<()>| async move {
        for _ in 0..4 {
            tokio::time::sleep(secs(8)).await;
            if let Some(state) = req.call_state() {
                state.progress().heartbeat();
            }
        }
        Ok::<_, ToolError>(http::Response::new(()))
    });
    let svc = layer().layer(tool);
    let reports = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&reports);
    let mut req = http::Request::new(());
    req.extensions_mut()
        .insert(CallState::new().on_progress(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
    let start = Instant::now();
    let res = svc.oneshot(req).await;
    assert!(res.is_ok(), "32 s with a report every 8 s: {res:?}");
    assert_eq!(start.elapsed(), secs(32));
    assert_eq!(reports.load(Ordering::SeqCst), 4);

    // and a silent one is cut at the idle limit, even without a state to report on
    let silent = service_fn(|_req: String| async {
        tokio::time::sleep(secs(30)).await;
        Ok::<_, ToolError>(String::new())
    });
    let start = Instant::now();
    let err = layer()
        .layer(silent)
        .oneshot(String::from("q"))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), secs(10));
    assert!(err.message().contains("no progress"), "{err}");
}

#[test]
fn config_idle_is_positive_and_within_the_attempt_timeout() {
    let cfg: TimeoutConfig =
        serde_json::from_str(r#"{"attempt": "60s", "idle": "10s", "soft": null}"#).unwrap();
    assert_eq!(cfg.idle, Some(secs(10)));
    assert!(TimeoutLayer::from_config(&cfg).is_ok());
    assert_eq!(TimeoutConfig::default().idle, None);

    let zero = TimeoutConfig {
        idle: Some(Duration::ZERO),
        ..TimeoutConfig::default()
    };
    let err = zero.validate().unwrap_err();
    assert!(err.problems().iter().any(|p| p.field == "idle"), "{err}");

    // Every problem listed at once: idle past the attempt, soft past the attempt.
    let cfg = TimeoutConfig {
        attempt: secs(5),
        soft: Some(secs(6)),
        idle: Some(secs(6)),
        total: None,
    };
    let err = TimeoutLayer::from_config(&cfg).unwrap_err();
    let fields: Vec<&str> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert!(
        fields.contains(&"idle") && fields.contains(&"soft"),
        "{err}"
    );
    assert!(
        err.to_string().contains("longer than the attempt timeout"),
        "{err}"
    );

    // idle equal to the attempt timeout is allowed (it never fires first)
    let equal = TimeoutConfig {
        idle: Some(secs(30)),
        ..TimeoutConfig::default()
    };
    assert!(equal.validate().is_ok());
}
