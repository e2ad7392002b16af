//! The idle limit at its edges (docs/progress.md): a report just before, at and just after
//! the idle expiry, a report in the same instant as the expiry or as the hard maximum,
//! zero and maximum limits, and an idle limit that reaches past the hard maximum. Tokio's
//! paused clock: every instant is exact.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::{service_fn, Layer, Service, ServiceExt};

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// Reports at each of `at` (times since the attempt started, in order), then stays silent.
fn reports_at(
    at: Vec<Duration>,
) -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone {
    service_fn(move |req: ToolRequest| {
        let at = at.clone();
        async move {
            let start = Instant::now();
            for (i, when) in at.into_iter().enumerate() {
                tokio::time::sleep_until(start + when).await;
                req.progress().report(i as f64, None, None);
            }
            std::future::pending::<()>().await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }
    })
}

/// A request whose callback counts the reports that reach the caller.
fn counted() -> (ToolRequest, Arc<AtomicU64>) {
    let seen = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&seen);
    let req = ToolRequest::new("crawl", json!({})).on_progress(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    });
    (req, seen)
}

/// Runs `tool` under a 60 s hard maximum and a 10 s idle limit; returns when it was cut,
/// the error, and how many reports reached the caller.
async fn cut<S>(tool: S) -> (Duration, ToolError, u64)
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError> + Send + 'static,
    S::Future: Send,
{
    let (req, seen) = counted();
    let begun = Instant::now();
    let err = TimeoutLayer::new(ms(60_000))
        .idle(ms(10_000))
        .layer(tool)
        .oneshot(req)
        .await
        .expect_err("a tool that ends silent is cut");
    (begun.elapsed(), err, seen.load(Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn a_report_just_before_the_idle_expiry_resets_it() {
    let (after, err, reports) = cut(reports_at(vec![ms(9_999)])).await;
    assert_eq!(after, ms(19_999));
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert_eq!(reports, 1);
}

#[tokio::test(start_paused = true)]
async fn a_report_made_by_the_tool_at_the_idle_expiry_resets_it() {
    // The tool is polled before the timer, as an answer ready at the limit wins: a report
    // it makes at that instant is activity within the limit.
    let (after, err, reports) = cut(reports_at(vec![ms(10_000)])).await;
    assert_eq!(after, ms(20_000));
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert_eq!(reports, 1);
}

#[tokio::test(start_paused = true)]
async fn a_report_just_after_the_idle_expiry_comes_too_late() {
    let (after, err, reports) = cut(reports_at(vec![ms(10_001)])).await;
    assert_eq!(after, ms(10_000));
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("no progress for 10s"), "{err}");
    assert_eq!(reports, 0);
}

#[tokio::test(start_paused = true)]
async fn reports_each_just_inside_the_limit_keep_an_attempt_alive_up_to_the_hard_maximum() {
    let at: Vec<Duration> = (1..=7).map(|i| ms(9_999 * i)).collect();
    let (after, err, reports) = cut(reports_at(at)).await;
    assert_eq!(after, ms(60_000));
    assert!(err.message().contains("attempt exceeded 60s"), "{err}");
    assert_eq!(reports, 6, "the report due at 69.993 s never happens");
}

#[tokio::test(start_paused = true)]
async fn a_report_at_the_hard_maximum_does_not_extend_it() {
    let (after, err, _) = cut(reports_at(vec![
        ms(9_000),
        ms(18_000),
        ms(27_000),
        ms(36_000),
        ms(45_000),
        ms(54_000),
        ms(60_000),
    ]))
    .await;
    assert_eq!(after, ms(60_000));
    assert!(err.message().contains("attempt exceeded 60s"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_expiry_past_the_hard_maximum_ends_at_the_hard_maximum() {
    // Last report at 51 s: the idle expiry would be 61 s.
    let at: Vec<Duration> = [9_000, 18_000, 27_000, 36_000, 45_000, 51_000]
        .into_iter()
        .map(ms)
        .collect();
    let (after, err, reports) = cut(reports_at(at)).await;
    assert_eq!(after, ms(60_000));
    assert!(err.message().contains("attempt exceeded 60s"), "{err}");
    assert_eq!(reports, 6);
}

#[tokio::test(start_paused = true)]
async fn a_report_from_another_task_in_the_same_instant_as_the_expiry_is_either_in_time_or_ignored()
{
    // A spawned task reports for the attempt at exactly 10 s, the instant the idle limit
    // expires. Either the report came first (the attempt lives on, cut 10 s later) or the
    // limit did (the attempt is over and the report is ignored): never a report counted
    // for an attempt cut at that instant.
    let tool = service_fn(|req: ToolRequest| async move {
        let progress = req.progress().clone();
        let at = Instant::now() + ms(10_000);
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            progress.report(1.0, None, None);
        });
        std::future::pending::<()>().await;
        Ok::<_, ToolError>(ToolResponse::new(json!("never")))
    });
    let (after, err, reports) = cut(tool).await;
    assert!(err.message().contains("no progress for 10s"), "{err}");
    match reports {
        0 => assert_eq!(after, ms(10_000)),
        1 => assert_eq!(after, ms(20_000)),
        n => panic!("{n} reports"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_zero_idle_limit_lets_only_a_ready_answer_through_and_never_spins() {
    let ready = service_fn(|req: ToolRequest| {
        req.progress().heartbeat();
        std::future::ready(Ok::<_, ToolError>(ToolResponse::new(json!("now"))))
    });
    let res = TimeoutLayer::new(ms(60_000))
        .idle(Duration::ZERO)
        .layer(ready)
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .expect("ready at the first poll");
    assert_eq!(res.output, json!("now"));

    // A tool that reports on every poll without time passing: still cut at once.
    let busy = service_fn(|req: ToolRequest| async move {
        for _ in 0..1_000 {
            req.progress().heartbeat();
            tokio::task::yield_now().await;
        }
        std::future::pending::<()>().await;
        Ok::<_, ToolError>(ToolResponse::new(json!("never")))
    });
    let begun = Instant::now();
    let err = tokio::time::timeout(
        ms(1),
        TimeoutLayer::new(ms(60_000))
            .idle(Duration::ZERO)
            .layer(busy)
            .oneshot(ToolRequest::new("t", json!({}))),
    )
    .await
    .expect("cut, not spinning")
    .expect_err("cut at once");
    assert_eq!(begun.elapsed(), Duration::ZERO);
    assert_eq!(err.kind(), ErrorKind::Timeout);
}

#[tokio::test(start_paused = true)]
async fn an_idle_limit_equal_to_the_hard_maximum_ends_as_the_hard_maximum() {
    let begun = Instant::now();
    let err = TimeoutLayer::new(ms(10_000))
        .idle(ms(10_000))
        .layer(reports_at(vec![]))
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .expect_err("cut");
    assert_eq!(begun.elapsed(), ms(10_000));
    assert!(err.message().contains("attempt exceeded 10s"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn maximum_limits_with_reports_never_overflow_and_a_silent_tool_is_cut_by_idle() {
    // Both limits at `Duration::MAX` (clamped): reports every day for a week, then an
    // answer.
    let tool = service_fn(|req: ToolRequest| async move {
        for day in 1..=7 {
            tokio::time::sleep(ms(86_400_000)).await;
            req.progress().report(f64::from(day), 7.0, Some("day"));
        }
        Ok::<_, ToolError>(ToolResponse::new(json!("week")))
    });
    let (req, seen) = counted();
    let res = TimeoutLayer::new(Duration::MAX)
        .idle(Duration::MAX)
        .layer(tool)
        .oneshot(req)
        .await
        .expect("a week is within the limits");
    assert_eq!(res.output, json!("week"));
    assert_eq!(seen.load(Ordering::SeqCst), 7);

    // The largest hard maximum, a short idle limit: the idle limit cuts a silent tool.
    let begun = Instant::now();
    let err = TimeoutLayer::new(Duration::MAX)
        .idle(ms(10_000))
        .layer(reports_at(vec![ms(5_000)]))
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .expect_err("cut");
    assert_eq!(begun.elapsed(), ms(15_000));
    assert!(err.message().contains("no progress for 10s"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn idle_and_hard_limits_run_from_the_same_start_when_the_future_is_polled_late() {
    // The attempt is called at 0 and first polled at 5 s: both limits count from one
    // instant, so a silent tool is cut `idle` after it and a reporting one `attempt`
    // after it.
    async fn run(reports: Vec<Duration>) -> (Duration, ToolError) {
        let mut svc = TimeoutLayer::new(ms(60_000))
            .idle(ms(10_000))
            .layer(reports_at(reports));
        let begun = Instant::now();
        let fut = svc
            .ready()
            .await
            .unwrap()
            .call(ToolRequest::new("t", json!({})));
        tokio::time::sleep(ms(5_000)).await;
        let err = fut.await.expect_err("cut");
        (begun.elapsed(), err)
    }
    let (silent, err) = run(vec![]).await;
    assert!(err.message().contains("no progress for 10s"), "{err}");
    let every_5s: Vec<Duration> = (1..=20).map(|i| ms(5_000 * i)).collect();
    let (reporting, err) = run(every_5s).await;
    assert!(err.message().contains("attempt exceeded 60s"), "{err}");
    assert_eq!(
        reporting - silent,
        ms(50_000),
        "silent cut at {silent:?}, reporting cut at {reporting:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_in_the_same_instant_as_the_idle_expiry_cuts_once_with_timeout() {
    let begun = Instant::now();
    let err = DeadlineLayer::new(ms(10_000))
        .layer(
            TimeoutLayer::new(ms(60_000))
                .idle(ms(10_000))
                .layer(reports_at(vec![])),
        )
        .oneshot(ToolRequest::new("t", json!({})))
        .await
        .expect_err("cut");
    assert_eq!(begun.elapsed(), ms(10_000));
    assert_eq!(err.kind(), ErrorKind::Timeout);
}

#[tokio::test(start_paused = true)]
async fn a_report_after_the_cut_reaches_nobody() {
    // A task the attempt left behind reports after the attempt was cut.
    let tool = service_fn(|req: ToolRequest| async move {
        let progress = req.progress().clone();
        tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(ms(20_000)).await;
                progress.report(1.0, None, Some("still here"));
            }
        });
        std::future::pending::<()>().await;
        Ok::<_, ToolError>(ToolResponse::new(json!("never")))
    });
    let (req, seen) = counted();
    let begun = Instant::now();
    let err = TimeoutLayer::new(ms(60_000))
        .idle(ms(10_000))
        .layer(tool)
        .oneshot(req)
        .await
        .expect_err("silent: cut");
    assert_eq!(begun.elapsed(), ms(10_000));
    assert!(err.message().contains("no progress for 10s"), "{err}");
    tokio::time::sleep(ms(200_000)).await;
    assert_eq!(seen.load(Ordering::SeqCst), 0);
}
