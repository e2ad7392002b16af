//! The generic layers (timeout, deadline, cancel, retry, breaker) put directly on tower
//! services that are not `Service<ToolRequest>`: a `service_fn` over
//! `http::Request<String>`, a `!Clone` service behind `Buffer`, tower's `MapErr` and
//! `MapResponse` outputs, and stacks erased into `BoxService` / `BoxCloneService`. No
//! adapter and no `map_err` between them; each layer keeps its semantics there (a timeout
//! fires, a breaker opens and rejects with a `ToolError` the caller can match or
//! downcast, a retry re-sends a clone, cancellation stops the call), the inner service's
//! `poll_ready` backpressure reaches the caller, and their errors compose with tower's
//! `BoxError` in both directions.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_breaker::BreakerLayer;
use toolshield_cancel::CancelLayer;
use toolshield_core::{CallState, ErrorKind, ToolError};
use toolshield_retry::RetryLayer;
use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
use tower::buffer::Buffer;
use tower::limit::ConcurrencyLimitLayer;
use tower::util::{BoxCloneService, BoxService};
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};

type Req = http::Request<String>;
type Res = http::Response<String>;

fn get(uri: &str) -> Req {
    http::Request::get(uri)
        .header("x-trace", "t-1")
        .body(String::from("query"))
        .expect("a valid request")
}

fn post(uri: &str) -> Req {
    http::Request::post(uri)
        .body(String::from("{\"amount\":1}"))
        .expect("a valid request")
}

fn status(code: u16) -> Res {
    http::Response::builder()
        .status(code)
        .body(String::new())
        .expect("a valid response")
}

/// A web service that answers 200 after `delay`, counting its calls.
fn web_after(
    delay: Duration,
    calls: Arc<AtomicU32>,
) -> impl Service<Req, Response = Res, Error = BoxError, Future: Send> + Clone + Send {
    service_fn(move |_req: Req| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, BoxError>(status(200))
        }
    })
}

/// A web service that always answers `code`, counting its calls.
fn web_answering(
    code: u16,
    calls: Arc<AtomicU32>,
) -> impl Service<Req, Response = Res, Error = BoxError, Future: Send> + Clone + Send {
    service_fn(move |_req: Req| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(status(code)) }
    })
}

fn reset() -> BoxError {
    Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
}

#[tokio::test(start_paused = true)]
async fn a_timeout_on_an_http_service_fires_at_its_limit_as_a_typed_timeout() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = TimeoutLayer::new(Duration::from_secs(1))
        .layer(web_after(Duration::from_secs(30), Arc::clone(&calls)));
    let started = Instant::now();
    let err: ToolError = svc
        .oneshot(get("http://api.example.com/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1),
        "cut at the limit"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_total_deadline_on_an_http_service_bounds_the_retries_inside_it() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(3)))
        .layer(RetryLayer::new(100))
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(web_after(Duration::from_secs(30), Arc::clone(&calls)));
    let started = Instant::now();
    let err = svc
        .oneshot(get("http://api.example.com/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(
        started.elapsed() <= Duration::from_secs(3),
        "the deadline ends the call: {:?}",
        started.elapsed()
    );
    assert!(
        calls.load(Ordering::SeqCst) < 100,
        "retries stopped at the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_breaker_on_an_http_service_opens_on_5xx_and_rejects_without_calling() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = BreakerLayer::default().layer(web_answering(503, Arc::clone(&calls)));
    // A 503 is a failure carried in a successful response: five in a row open the
    // breaker (the default), and the raw response still reaches the caller.
    for _ in 0..5 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(get("http://api.example.com/"))
            .await
            .expect("the 503 response is handed back");
        assert_eq!(res.status(), 503);
    }
    let err: ToolError = svc
        .ready()
        .await
        .unwrap()
        .call(get("http://api.example.com/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(calls.load(Ordering::SeqCst), 5, "rejected without a call");

    // The key is the host: another host is not rejected.
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(get("http://other.example.com/"))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

#[tokio::test(start_paused = true)]
async fn a_breaker_rejection_boxed_by_tower_downcasts_to_a_tool_error() {
    let calls = Arc::new(AtomicU32::new(0));
    let failing = service_fn({
        let calls = Arc::clone(&calls);
        move |_req: Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<Res, BoxError>(reset()) }
        }
    });
    // The caller sees only tower's `BoxError`, as behind any tower middleware.
    let svc = ServiceBuilder::new()
        .map_err(BoxError::from)
        .layer(BreakerLayer::default())
        .service(failing);
    let mut last = None;
    for _ in 0..6 {
        last = Some(
            svc.clone()
                .oneshot(get("http://api.example.com/"))
                .await
                .unwrap_err(),
        );
    }
    let boxed: BoxError = last.expect("six calls");
    let err = boxed
        .downcast_ref::<ToolError>()
        .expect("the rejection is a ToolError inside the BoxError");
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

/// What one attempt saw: URI, `x-trace` header, body, attempt number.
type Seen = (String, String, String, u32);

#[tokio::test(start_paused = true)]
async fn a_retry_on_an_http_service_resends_a_clone_of_the_request() {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let svc = service_fn({
        let seen = Arc::clone(&seen);
        move |req: Req| {
            let attempt = req
                .extensions()
                .get::<CallState>()
                .map_or(0, CallState::attempt);
            let mut seen = seen.lock().unwrap();
            seen.push((
                req.uri().to_string(),
                req.headers()["x-trace"].to_str().unwrap().to_owned(),
                req.body().clone(),
                attempt,
            ));
            let n = seen.len();
            async move {
                if n < 3 {
                    Err::<Res, BoxError>(reset())
                } else {
                    Ok(status(200))
                }
            }
        }
    });
    let res = RetryLayer::new(3)
        .layer(svc)
        .oneshot(get("http://api.example.com/items"))
        .await
        .expect("the third attempt answers");
    assert_eq!(res.status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3, "two connection resets retried");
    for (uri, trace, body, _) in seen.iter() {
        assert_eq!(uri, "http://api.example.com/items");
        assert_eq!(trace, "t-1");
        assert_eq!(body, "query");
    }
    let attempts: Vec<u32> = seen.iter().map(|s| s.3).collect();
    assert!(
        attempts.windows(2).all(|w| w[0] < w[1]),
        "each attempt is numbered on its own clone: {attempts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_on_an_http_service_never_repeats_a_post_without_a_key() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = RetryLayer::new(3).layer(web_answering(503, Arc::clone(&calls)));
    let res = svc
        .clone()
        .oneshot(post("http://api.example.com/pay"))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a keyless POST is sent once"
    );

    // The same 503 to a GET is retried.
    calls.store(0, Ordering::SeqCst);
    let res = svc.oneshot(get("http://api.example.com/")).await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Sets `dropped` when the future holding it is dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_call_token_of_an_http_request_stops_the_call() {
    let dropped = Arc::new(AtomicBool::new(false));
    let svc = CancelLayer::new().layer(service_fn({
        let dropped = Arc::clone(&dropped);
        move |_req: Req| {
            let flag = DropFlag(Arc::clone(&dropped));
            async move {
                let _flag = flag;
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, BoxError>(status(200))
            }
        }
    }));
    let token = CancellationToken::new();
    let mut req = get("http://api.example.com/");
    req.extensions_mut()
        .insert(CallState::new().with_call_token(token.clone()));
    let started = Instant::now();
    let call = tokio::spawn(svc.clone().oneshot(req));
    tokio::time::sleep(Duration::from_secs(1)).await;
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert!(dropped.load(Ordering::SeqCst), "the inner call was dropped");

    // A token cancelled before the call: the service is never called.
    dropped.store(false, Ordering::SeqCst);
    let mut req = get("http://api.example.com/");
    req.extensions_mut()
        .insert(CallState::new().with_call_token(token));
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(!dropped.load(Ordering::SeqCst), "never called");
}

#[tokio::test(start_paused = true)]
async fn the_attempt_token_of_an_http_request_fires_when_the_timeout_cuts_it() {
    let fired = Arc::new(AtomicBool::new(false));
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new())
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(service_fn({
            let fired = Arc::clone(&fired);
            move |req: Req| {
                let token = req
                    .extensions()
                    .get::<CallState>()
                    .map(|s| s.tokens().attempt().clone());
                let fired = Arc::clone(&fired);
                async move {
                    let token = token.expect("the attempt token is on the request");
                    tokio::spawn(async move {
                        token.cancelled().await;
                        fired.store(true, Ordering::SeqCst);
                    });
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<_, BoxError>(status(200))
                }
            }
        }));
    let mut req = get("http://api.example.com/");
    req.extensions_mut().insert(CallState::new());
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    tokio::task::yield_now().await;
    assert!(fired.load(Ordering::SeqCst), "the tool's token fired");
}

/// The stacks the backpressure test runs, each around a concurrency limit of one.
macro_rules! backpressure_case {
    ($name:ident, $stack:expr) => {
        #[tokio::test(start_paused = true)]
        async fn $name() {
            let calls = Arc::new(AtomicU32::new(0));
            let inner = ConcurrencyLimitLayer::new(1)
                .layer(web_after(Duration::from_secs(10), Arc::clone(&calls)));
            let svc = $stack.service(inner);

            let mut first = svc.clone();
            first.ready().await.expect("the first permit");
            let in_flight = tokio::spawn(first.call(get("http://api.example.com/")));

            // The one permit is held: the stack is not ready while the call runs.
            let mut second = svc.clone();
            let waited = tokio::time::timeout(Duration::from_secs(5), second.ready()).await;
            assert!(
                waited.is_err(),
                "the inner limit's backpressure reaches the caller"
            );

            in_flight.await.unwrap().expect("the first call answers");
            tokio::time::timeout(Duration::from_secs(1), second.ready())
                .await
                .expect("ready once the permit is back")
                .expect("no readiness error");
            assert_eq!(calls.load(Ordering::SeqCst), 1);
        }
    };
}

backpressure_case!(
    a_timeout_honours_the_readiness_of_its_inner_service,
    ServiceBuilder::new().layer(TimeoutLayer::new(Duration::from_secs(30)))
);
backpressure_case!(
    a_cancel_layer_honours_the_readiness_of_its_inner_service,
    ServiceBuilder::new().layer(CancelLayer::new())
);
backpressure_case!(
    a_breaker_honours_the_readiness_of_its_inner_service,
    ServiceBuilder::new().layer(BreakerLayer::default())
);
backpressure_case!(
    a_retry_honours_the_readiness_of_its_inner_service,
    ServiceBuilder::new().layer(RetryLayer::new(3))
);
backpressure_case!(
    the_documented_stack_honours_the_readiness_of_its_inner_service,
    ServiceBuilder::new()
        .layer(CancelLayer::new())
        .layer(DeadlineLayer::new(Duration::from_secs(60)))
        .layer(RetryLayer::new(3))
        .layer(BreakerLayer::default())
        .layer(TimeoutLayer::new(Duration::from_secs(30)))
);

/// A service that cannot be cloned (one connection, say): it fails its first `fail`
/// calls with a reset connection, then answers after `delay`.
struct OneConnection {
    calls: Arc<AtomicU32>,
    fail: u32,
    delay: Duration,
}

impl Service<Req> for OneConnection {
    type Response = Res;
    type Error = std::io::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Res, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Req) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let (fail, delay) = (n <= self.fail, self.delay);
        Box::pin(async move {
            if fail {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
            }
            tokio::time::sleep(delay).await;
            Ok(status(200))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_not_clone_service_behind_buffer_takes_retry_breaker_and_timeout() {
    let calls = Arc::new(AtomicU32::new(0));
    let conn = OneConnection {
        calls: Arc::clone(&calls),
        fail: 2,
        delay: Duration::from_millis(10),
    };
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(3))
        .layer(BreakerLayer::default())
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(Buffer::new(conn, 8));
    let res = svc
        .clone()
        .oneshot(get("http://api.example.com/"))
        .await
        .expect("two resets retried through the buffer");
    assert_eq!(res.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // A slow call through the buffer is cut by the timeout outside it.
    let slow = OneConnection {
        calls: Arc::clone(&calls),
        fail: 0,
        delay: Duration::from_secs(60),
    };
    let err = TimeoutLayer::new(Duration::from_secs(1))
        .layer(Buffer::new(slow, 8))
        .oneshot(get("http://api.example.com/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
}

#[tokio::test(start_paused = true)]
async fn the_stacked_service_erases_into_box_clone_service_and_box_service() {
    let calls = Arc::new(AtomicU32::new(0));
    // Each stack has its own breaker registry: the six timeouts below would open a
    // shared one.
    let stack = || {
        ServiceBuilder::new()
            .layer(CancelLayer::new())
            .layer(RetryLayer::new(3))
            .layer(BreakerLayer::default())
            .layer(TimeoutLayer::new(Duration::from_secs(1)))
            .service(web_after(Duration::from_secs(30), Arc::clone(&calls)))
    };

    let erased: BoxCloneService<Req, Res, ToolError> = BoxCloneService::new(stack());
    let err = erased
        .clone()
        .oneshot(get("http://api.example.com/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "timeouts are retried");

    let boxed: BoxService<Req, Res, ToolError> = BoxService::new(stack());
    let err = boxed
        .oneshot(get("http://api.example.com/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);

    // And an erased `BoxError` service takes the layers again from outside.
    let inner: BoxCloneService<Req, Res, BoxError> =
        BoxCloneService::new(web_answering(200, Arc::clone(&calls)));
    let res = TimeoutLayer::new(Duration::from_secs(1))
        .layer(inner)
        .oneshot(get("http://api.example.com/"))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
}

/// The same five layers in several orders around a service that is slow on its first
/// call: each order compiles on the plain HTTP service, and in each the slow attempt is
/// cut by the attempt timeout.
macro_rules! order_case {
    ($name:ident, $stack:expr, $expect_retry:expr) => {
        #[tokio::test(start_paused = true)]
        async fn $name() {
            let calls = Arc::new(AtomicU32::new(0));
            let inner = service_fn({
                let calls = Arc::clone(&calls);
                move |_req: Req| {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        if n == 1 {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                        }
                        Ok::<_, BoxError>(status(200))
                    }
                }
            });
            let svc = $stack.service(inner);
            let result = svc.oneshot(get("http://api.example.com/")).await;
            if $expect_retry {
                assert_eq!(result.expect("the retry answers").status(), 200);
                assert_eq!(calls.load(Ordering::SeqCst), 2);
            } else {
                assert_eq!(result.unwrap_err().kind(), ErrorKind::Timeout);
                assert_eq!(calls.load(Ordering::SeqCst), 1);
            }
        }
    };
}

order_case!(
    the_documented_order_on_an_http_service_retries_a_cut_attempt,
    ServiceBuilder::new()
        .layer(CancelLayer::new())
        .layer(DeadlineLayer::new(Duration::from_secs(120)))
        .layer(RetryLayer::new(3))
        .layer(BreakerLayer::default())
        .layer(TimeoutLayer::new(Duration::from_secs(1))),
    true
);
order_case!(
    the_reversed_order_on_an_http_service_times_out_the_whole_call,
    ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .layer(BreakerLayer::default())
        .layer(RetryLayer::new(3))
        .layer(DeadlineLayer::new(Duration::from_secs(120)))
        .layer(CancelLayer::new()),
    false
);
order_case!(
    breaker_outside_retry_on_an_http_service_retries_a_cut_attempt,
    ServiceBuilder::new()
        .layer(BreakerLayer::default())
        .layer(CancelLayer::new())
        .layer(RetryLayer::new(3))
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .layer(DeadlineLayer::new(Duration::from_secs(120))),
    true
);

/// An error type of a client library that toolshield does not know.
#[derive(Debug)]
struct ClientError(&'static str);

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ClientError {}

#[tokio::test(start_paused = true)]
async fn layers_wrap_the_outputs_of_tower_map_err_and_map_response() {
    let calls = Arc::new(AtomicU32::new(0));
    let client = service_fn({
        let calls = Arc::clone(&calls);
        move |_req: Req| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n == 1 {
                    Err(ClientError("connection reset"))
                } else {
                    Ok(status(200))
                }
            }
        }
    });
    // tower's `MapErr` makes the foreign error a `BoxError`; `MapResponse` reads the
    // status out of the response.
    let adapted = client
        .map_err(|e: ClientError| -> BoxError {
            Box::new(std::io::Error::new(std::io::ErrorKind::ConnectionReset, e))
        })
        .map_response(|res: Res| res.status().as_u16());
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(3))
        .layer(BreakerLayer::default())
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(adapted);
    assert_eq!(
        svc.oneshot(get("http://api.example.com/")).await.unwrap(),
        200
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the mapped reset is retried"
    );
}

#[tokio::test(start_paused = true)]
async fn tower_timeout_outside_the_layers_boxes_their_errors_for_downcast() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(100))
        .layer(RetryLayer::new(2))
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(web_after(Duration::from_secs(30), Arc::clone(&calls)));
    let err: BoxError = svc
        .oneshot(get("http://api.example.com/"))
        .await
        .unwrap_err();
    let err = err
        .downcast_ref::<ToolError>()
        .expect("tower's Timeout passes the ToolError through as a BoxError");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A client's own error type, as hyper's or a database driver's is: defined in another
/// crate, so no `From<DriverError> for ToolError` can be written by the user.
#[derive(Debug)]
struct DriverError(std::io::Error);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "client error: {}", self.0)
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[tokio::test(start_paused = true)]
async fn a_service_failing_with_a_foreign_error_type_takes_every_layer_without_map_err() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let client = service_fn(move |_req: Req| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(DriverError(std::io::Error::from(
                    std::io::ErrorKind::ConnectionReset,
                )))
            } else {
                Ok(status(200))
            }
        }
    });
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new())
        .layer(RetryLayer::new(3).without_budget())
        .layer(BreakerLayer::new(
            toolshield_breaker::BreakerRegistry::default(),
        ))
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(client);
    // The reset, found down the foreign error's sources, is CONNECTION_FAILED: retried.
    let res = svc.oneshot(get("http://tool.test/a")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
