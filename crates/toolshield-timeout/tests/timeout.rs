//! Behaviour of the attempt timeout, the soft threshold and the whole-call deadline.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use std::future::Future;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_core::{ErrorKind, ShieldResponse, ToolError, ToolRequest, ToolResponse};
use toolshield_timeout::{DeadlineLayer, TimeoutConfig, TimeoutLayer};
use tower::Layer;
use tower::{service_fn, Service, ServiceExt};

/// Sets its flag when dropped: observes that a future was dropped.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn sleeper(
    d: Duration,
) -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone {
    service_fn(move |_req: ToolRequest| async move {
        tokio::time::sleep(d).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("done")))
    })
}

#[tokio::test(start_paused = true)]
async fn each_attempt_gets_a_fresh_timeout() {
    // 3 s per call against a 4 s attempt timeout: two calls in a row (6 s in all) both
    // succeed, because the budget is per attempt, not per service.
    let mut svc = TimeoutLayer::new(secs(4)).layer(sleeper(secs(3)));
    let start = Instant::now();
    for attempt in 1..=2 {
        let mut req = ToolRequest::new("t", json!(null));
        req.begin_attempt(attempt);
        let res = svc.ready().await.unwrap().call(req).await;
        assert!(res.is_ok(), "attempt {attempt}: {res:?}");
    }
    assert_eq!(start.elapsed(), secs(6));

    // and a call over budget fails after exactly the attempt timeout
    let mut svc = TimeoutLayer::new(secs(4)).layer(sleeper(secs(5)));
    let start = Instant::now();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), secs(4));
    assert!(err.message().contains("4s"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn timed_out_inner_future_is_dropped_and_its_child_token_cancelled() {
    let dropped = Arc::new(AtomicBool::new(false));
    let seen_token: Arc<Mutex<Option<CancellationToken>>> = Arc::default();
    let (d, s) = (dropped.clone(), seen_token.clone());
    let tool = service_fn(move |req: ToolRequest| {
        let flag = DropFlag(d.clone());
        *s.lock().unwrap() = Some(req.attempt_token().clone());
        async move {
            let _flag = flag;
            tokio::time::sleep(secs(3600)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }
    });
    let mut svc = TimeoutLayer::new(secs(2)).layer(tool);
    let req = ToolRequest::new("t", json!(null));
    let call_token = req.call_token().clone();
    let mut fut = Box::pin(svc.ready().await.unwrap().call(req));

    // Poll until it completes, keeping the future alive afterwards: the inner future must be
    // dropped by the timeout itself, not by our drop of the outer future.
    let result = std::future::poll_fn(|cx| fut.as_mut().poll(cx)).await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Timeout);
    assert!(
        dropped.load(Ordering::SeqCst),
        "inner future still alive after the timeout"
    );
    let token = seen_token.lock().unwrap().clone().unwrap();
    assert!(
        token.is_cancelled(),
        "the tool's child token must fire on timeout"
    );
    assert!(
        !call_token.is_cancelled(),
        "the caller's token is left alone"
    );
    drop(fut);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_cancels_the_attempt_token_but_success_does_not() {
    let tool = service_fn(|req: ToolRequest| {
        let token = req.attempt_token().clone();
        async move {
            tokio::time::sleep(secs(1)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!(token.is_cancelled())))
        }
    });
    let mut svc = TimeoutLayer::new(secs(10)).layer(tool);

    let req = ToolRequest::new("t", json!(null));
    let attempt = req.attempt_token().clone();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.output, json!(false));
    assert!(
        !attempt.is_cancelled(),
        "a finished attempt is not cancelled"
    );

    let req = ToolRequest::new("t", json!(null));
    let attempt = req.attempt_token().clone();
    let fut = svc.ready().await.unwrap().call(req);
    drop(fut);
    assert!(attempt.is_cancelled(), "an abandoned attempt is cancelled");
}

#[tokio::test(start_paused = true)]
async fn slow_success_is_marked_and_still_succeeds() {
    let mut svc = TimeoutLayer::new(secs(4))
        .soft_threshold(secs(2))
        .layer(sleeper(secs(3)));
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap();
    assert_eq!(res.output, json!("done"));
    assert!(res.provenance.slow);
    let mark = res.slow_call().expect("slow mark");
    assert_eq!(mark.elapsed, secs(3));
    assert_eq!(mark.threshold, secs(2));

    let mut fast = TimeoutLayer::new(secs(4))
        .soft_threshold(secs(2))
        .layer(sleeper(secs(1)));
    let res = fast
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap();
    assert!(!res.provenance.slow);
    assert!(res.slow_call().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_success_exactly_at_the_soft_threshold_is_not_slow() {
    // Slow means slower than the threshold, as Resilience4j's slow-call duration
    // threshold ("calls slower than"): a call that took the threshold exactly is not.
    let mut at = TimeoutLayer::new(secs(4))
        .soft_threshold(secs(2))
        .layer(sleeper(secs(2)));
    let res = at
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap();
    assert!(!res.provenance.slow);
    assert!(res.slow_call().is_none());

    let mut over = TimeoutLayer::new(secs(4))
        .soft_threshold(secs(2))
        .layer(sleeper(secs(2) + Duration::from_millis(1)));
    let res = over
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap();
    assert!(res.provenance.slow, "1 ms over the threshold is slow");
}

#[tokio::test(start_paused = true)]
async fn inner_errors_pass_through_unchanged() {
    let tool = service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::rate_limited("slow down", Some(secs(7))))
    });
    let mut svc = TimeoutLayer::new(secs(4)).layer(tool);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(secs(7)));
}

#[tokio::test(start_paused = true)]
async fn deadline_is_written_on_the_request_and_bounds_the_whole_call() {
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    let tool = service_fn(move |req: ToolRequest| {
        *s.lock().unwrap() = req.deadline_at();
        async move {
            tokio::time::sleep(secs(3600)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }
    });
    let mut svc = DeadlineLayer::new(secs(10)).layer(tool);
    let start = Instant::now();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), secs(10));
    assert_eq!(*seen.lock().unwrap(), Some(start + secs(10)));
    assert_eq!(err.elapsed(), Some(secs(10)));
}

#[tokio::test(start_paused = true)]
async fn an_earlier_deadline_on_the_request_wins_and_a_passed_one_never_calls_the_tool() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let tool = service_fn(move |_req: ToolRequest| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(secs(3600)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }
    });
    let mut svc = DeadlineLayer::new(secs(10)).layer(tool);
    let start = Instant::now();
    let req = ToolRequest::new("t", json!(null)).deadline(start + secs(3));
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), secs(3));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let past = ToolRequest::new("t", json!(null)).deadline(Instant::now());
    let err = svc.ready().await.unwrap().call(past).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the tool must not run past the deadline"
    );
}

#[test]
fn config_defaults_parse_and_validation_lists_every_problem() {
    let d = TimeoutConfig::default();
    assert_eq!(d.attempt, secs(30));
    assert_eq!(d.soft, Some(secs(2)));
    assert_eq!(d.total, None);
    assert!(d.validate().is_ok());

    let cfg: TimeoutConfig =
        serde_json::from_str(r#"{"attempt": "0s", "soft": "45s", "total": "10s"}"#).unwrap();
    let err = cfg.validate().unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["attempt", "soft"], "{err}");

    let cfg: TimeoutConfig = serde_json::from_str(r#"{"attempt": "30s", "total": "10s"}"#).unwrap();
    let err = TimeoutLayer::from_config(&cfg).unwrap_err();
    assert!(
        err.to_string().contains("longer than the total deadline"),
        "{err}"
    );

    assert!(serde_json::from_str::<TimeoutConfig>(r#"{"atempt": "3s"}"#).is_err());
}

/// A tool that never answers and hands out the attempt token it was given.
fn watcher(
    seen: Arc<Mutex<Option<CancellationToken>>>,
) -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone {
    service_fn(move |req: ToolRequest| {
        *seen.lock().unwrap() = Some(req.attempt_token().clone());
        async move {
            tokio::time::sleep(secs(3600)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("never")))
        }
    })
}

/// Calls `svc` and returns the error and whether the tool's attempt token was cancelled
/// when the call returned.
async fn cut<S>(mut svc: S, seen: &Mutex<Option<CancellationToken>>) -> (ErrorKind, bool)
where
    S: Service<ToolRequest, Response = ToolResponse, Error = ToolError>,
{
    let req = ToolRequest::new("t", json!(null));
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
    let token = seen.lock().unwrap().clone().expect("the tool was called");
    (err.kind(), token.is_cancelled())
}

#[tokio::test(start_paused = true)]
async fn a_call_cut_by_the_deadline_cancels_its_attempt_token_whoever_guards_it() {
    // The deadline alone guards the token.
    let seen = Arc::default();
    let svc = DeadlineLayer::new(secs(1)).layer(watcher(Arc::clone(&seen)));
    assert_eq!(cut(svc, &seen).await, (ErrorKind::Timeout, true));

    // Guarded below by the attempt timeout, as in the shield's stack: the deadline drops
    // the timeout's future, whose guard cancels the token.
    let seen = Arc::default();
    let svc = DeadlineLayer::new(secs(1))
        .attempts_guarded_below()
        .layer(TimeoutLayer::new(secs(30)).layer(watcher(Arc::clone(&seen))));
    assert_eq!(cut(svc, &seen).await, (ErrorKind::Timeout, true));

    // Said to be guarded below with nothing below to do it: the token is left alone,
    // which is what the option promises not to need.
    let seen = Arc::default();
    let svc = DeadlineLayer::new(secs(1))
        .attempts_guarded_below()
        .layer(watcher(Arc::clone(&seen)));
    assert_eq!(cut(svc, &seen).await, (ErrorKind::Timeout, false));
}

#[tokio::test(start_paused = true)]
async fn an_answer_ready_when_the_limit_is_reached_wins() {
    // The tool's sleep and the timer end at the same instant: the answer is there, so the
    // call succeeds, for the attempt timeout and for the whole-call deadline alike.
    let mut attempt = TimeoutLayer::new(secs(4)).layer(sleeper(secs(4)));
    let res = attempt
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await;
    assert!(res.is_ok(), "{res:?}");
    let mut total = DeadlineLayer::new(secs(4)).layer(sleeper(secs(4)));
    let res = total
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await;
    assert!(res.is_ok(), "{res:?}");
    // One tick later it is too late.
    let mut late = TimeoutLayer::new(secs(4)).layer(sleeper(secs(4) + Duration::from_millis(1)));
    let err = late
        .ready()
        .await
        .unwrap()
        .call(ToolRequest::new("t", json!(null)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
}
