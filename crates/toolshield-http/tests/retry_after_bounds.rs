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
