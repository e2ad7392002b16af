//! A peer's `Retry-After` far in the future (`99999999999999` seconds, a date in year
//! 9999) through the HTTP error layer and the retry layer, on tokio's paused clock: no
//! panic; by default no wait at all (longer than `max_retry_after`); allowed to wait, a
//! wait of at most `MAX_DURATION`; and with a deadline the call ends by it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use toolshield_core::config::MAX_DURATION;
use toolshield_core::ToolError;
use toolshield_http::HttpErrorLayer;
use toolshield_retry::{BudgetConfig, RetryConfig, RetryLayer};
use toolshield_timeout::DeadlineLayer;
use tower::{service_fn, ServiceBuilder, ServiceExt};

const FAR: [&str; 2] = ["99999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"];

/// Answers 429 with `retry_after` once, then 200; records when each call arrived.
fn upstream(
    retry_after: &'static str,
    seen: Arc<Mutex<Vec<Instant>>>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = ToolError,
    Future = impl Send,
> + Clone {
    service_fn(move |_req: Request<Full<Bytes>>| {
        let seen = Arc::clone(&seen);
        async move {
            let mut seen = seen.lock().unwrap();
            seen.push(Instant::now());
            let res = if seen.len() == 1 {
                Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header(http::header::RETRY_AFTER, retry_after)
                    .body(Full::new(Bytes::from_static(b"slow down")))
            } else {
                Response::builder().body(Full::new(Bytes::from_static(b"ok")))
            };
            Ok::<_, ToolError>(res.unwrap())
        }
    })
}

fn retry() -> RetryLayer {
    RetryLayer::from_config(&RetryConfig {
        budget: BudgetConfig {
            enabled: false,
            ..BudgetConfig::default()
        },
        ..RetryConfig::default()
    })
    .unwrap()
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://weather.example/today")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_far_retry_after_waits_at_most_the_longest_duration_and_never_past_a_deadline() {
    for value in FAR {
        // By default a wait over `max_retry_after` (60 s) is not waited for: the 429 is
        // the answer at once, its wait cut to MAX_DURATION.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let svc = ServiceBuilder::new()
            .layer(retry())
            .layer(HttpErrorLayer::new())
            .service(upstream(value, Arc::clone(&seen)));
        let start = Instant::now();
        let res = svc.oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{value}");
        assert_eq!(start.elapsed(), Duration::ZERO, "{value}");
        assert_eq!(seen.lock().unwrap().len(), 1, "{value}");

        // Allowed to wait that long, no deadline: one retry, MAX_DURATION later.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let svc = ServiceBuilder::new()
            .layer(retry().with_max_retry_after(MAX_DURATION))
            .layer(HttpErrorLayer::new())
            .service(upstream(value, Arc::clone(&seen)));
        let res = svc.oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{value}");
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 2, "{value}");
            assert_eq!(seen[1] - seen[0], MAX_DURATION, "{value}");
        }

        // A 10 s deadline: no retry, the 429 is the answer, by the deadline.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let svc = ServiceBuilder::new()
            .layer(DeadlineLayer::new(Duration::from_secs(10)))
            .layer(retry())
            .layer(HttpErrorLayer::new())
            .service(upstream(value, Arc::clone(&seen)));
        let start = Instant::now();
        let res = svc.oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{value}");
        assert!(start.elapsed() <= Duration::from_secs(10), "{value}");
        assert_eq!(seen.lock().unwrap().len(), 1, "{value}");
    }
}

#[test]
fn a_delta_seconds_longer_than_a_u64_is_the_longest_wait_not_garbage() {
    // A server asking for more seconds than a u64 holds asks for a very long wait; read as
    // garbage it would be retried after the default backoff instead.
    let now = std::time::SystemTime::now();
    for value in [
        "18446744073709551616",
        "999999999999999999999999999999",
        " 99999999999999999999999 ",
    ] {
        assert_eq!(
            toolshield_http::parse_retry_after(&http::HeaderValue::from_static(value), now),
            Some(MAX_DURATION),
            "{value}"
        );
    }
}

/// Answers 429 with every `Retry-After` value in `values` once, then 200.
fn upstream_many(
    values: &'static [&'static str],
    seen: Arc<Mutex<Vec<Instant>>>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = ToolError,
    Future = impl Send,
> + Clone {
    service_fn(move |_req: Request<Full<Bytes>>| {
        let seen = Arc::clone(&seen);
        async move {
            let mut seen = seen.lock().unwrap();
            seen.push(Instant::now());
            let mut res = Response::builder();
            if seen.len() == 1 {
                res = res.status(StatusCode::TOO_MANY_REQUESTS);
                for v in values {
                    res = res.header(http::header::RETRY_AFTER, *v);
                }
            }
            Ok::<_, ToolError>(res.body(Full::new(Bytes::new())).unwrap())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn several_retry_after_headers_are_honoured_by_their_longest_wait() {
    // A server (or a proxy in front of it) sends two values: the call never comes back
    // sooner than any of them asked. Order must not matter.
    const SHORT_FIRST: &[&str] = &["0", "3600"];
    const LONG_FIRST: &[&str] = &["3600", "0"];
    const DATE_AND_GARBAGE: &[&str] = &["soon", "5", "2"];
    for values in [SHORT_FIRST, LONG_FIRST] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let svc = ServiceBuilder::new()
            .layer(retry())
            .layer(HttpErrorLayer::new())
            .service(upstream_many(values, Arc::clone(&seen)));
        let res = svc.oneshot(get()).await.unwrap();
        // 3600 s is over `max_retry_after` (60 s): the 429 is the answer, no retry.
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{values:?}");
        assert_eq!(seen.lock().unwrap().len(), 1, "{values:?}");
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = ServiceBuilder::new()
        .layer(retry())
        .layer(HttpErrorLayer::new())
        .service(upstream_many(DATE_AND_GARBAGE, Arc::clone(&seen)));
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1] - seen[0], Duration::from_secs(5));
}
