//! `ShieldRequest` for `http::Request` and `ShieldResponse` for `http::Response`.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use toolshield_core::{CallKind, ErrorKind, ShieldRequest, ShieldResponse};
use toolshield_http::{http_method_kind, http_status_kind, HttpRoute, RetryAfter};

#[test]
fn methods_map_to_call_kinds() {
    for m in [
        Method::GET,
        Method::HEAD,
        Method::PUT,
        Method::DELETE,
        Method::OPTIONS,
    ] {
        assert_eq!(http_method_kind(&m), CallKind::Idempotent, "{m}");
    }
    for m in [
        Method::POST,
        Method::PATCH,
        Method::from_bytes(b"PURGE").unwrap(),
    ] {
        assert_eq!(http_method_kind(&m), CallKind::Mutating, "{m}");
    }
}

#[test]
fn statuses_map_to_error_kinds() {
    let cases = [
        (200, None),
        (204, None),
        (304, None),
        (400, Some(ErrorKind::InvalidInput)),
        (401, Some(ErrorKind::Unauthorized)),
        (403, Some(ErrorKind::Unauthorized)),
        (404, Some(ErrorKind::NotFound)),
        // Request Timeout and Too Early: "try again", not "your arguments are wrong".
        (408, Some(ErrorKind::UpstreamUnavailable)),
        (409, Some(ErrorKind::InvalidInput)),
        (422, Some(ErrorKind::InvalidInput)),
        (425, Some(ErrorKind::UpstreamUnavailable)),
        (429, Some(ErrorKind::RateLimited)),
        (500, Some(ErrorKind::ExecutionFailed)),
        (501, Some(ErrorKind::ExecutionFailed)),
        (502, Some(ErrorKind::UpstreamUnavailable)),
        (503, Some(ErrorKind::UpstreamUnavailable)),
        (504, Some(ErrorKind::UpstreamUnavailable)),
    ];
    for (code, kind) in cases {
        assert_eq!(
            http_status_kind(StatusCode::from_u16(code).unwrap()),
            kind,
            "{code}"
        );
    }
    // 408 and 425 are retried; 500 is counted but not retried; other 4xx neither.
    assert!(ErrorKind::UpstreamUnavailable.is_retriable());
    assert!(ErrorKind::ExecutionFailed.counts_for_breaker());
    assert!(!ErrorKind::ExecutionFailed.is_retriable());
    assert!(!ErrorKind::InvalidInput.counts_for_breaker());
}

#[test]
fn the_key_is_the_host_unless_a_route_is_set() {
    let mut req = Request::get("http://api.example.com:8080/users/7")
        .body(())
        .unwrap();
    assert_eq!(req.call_name(), Some("api.example.com"));
    req.extensions_mut()
        .insert(HttpRoute::new("GET /users/{id}"));
    assert_eq!(req.call_name(), Some("GET /users/{id}"));
}

#[test]
fn the_idempotency_key_is_the_header_and_the_kind_can_be_overridden() {
    let mut req = Request::post("http://x/orders")
        .header("Idempotency-Key", "order-1")
        .body(())
        .unwrap();
    assert_eq!(req.call_idempotency_key(), Some("order-1"));
    assert_eq!(req.call_kind(), Some(CallKind::Mutating));
    req.extensions_mut()
        .insert(toolshield_core::CallState::new().with_kind(CallKind::Idempotent));
    assert_eq!(req.call_kind(), Some(CallKind::Idempotent));
    let plain = Request::post("http://x/orders").body(()).unwrap();
    assert_eq!(plain.call_idempotency_key(), None);
}

#[tokio::test(start_paused = true)]
async fn attempts_get_fresh_tokens_and_deadlines_only_shrink() {
    let mut req = Request::get("http://x/").body(()).unwrap();
    assert!(
        req.call_state().is_none(),
        "no state until a layer writes one"
    );
    req.begin_attempt(1);
    let state = |r: &Request<()>| r.call_state().cloned().unwrap();
    assert_eq!(state(&req).attempt(), 1);
    let first = state(&req).tokens().attempt().clone();
    let call = state(&req).tokens().call().clone();
    req.begin_attempt(2);
    assert_eq!(state(&req).attempt(), 2);
    first.cancel();
    assert!(
        !state(&req).tokens().attempt().is_cancelled(),
        "a fresh attempt token"
    );
    call.cancel();
    assert!(
        state(&req).tokens().attempt().is_cancelled(),
        "a child of the call token"
    );

    let now = tokio::time::Instant::now();
    let s = req.call_state_mut().unwrap();
    s.set_deadline(now + Duration::from_secs(5));
    s.set_deadline(now + Duration::from_secs(9));
    assert_eq!(s.deadline(), Some(now + Duration::from_secs(5)));
    s.set_deadline(now + Duration::from_secs(1));
    assert_eq!(s.deadline(), Some(now + Duration::from_secs(1)));
}

#[test]
fn responses_carry_in_band_failures_with_retry_after() {
    let ok = Response::builder().status(200).body(()).unwrap();
    assert!(ok.in_band_failure().is_none());

    let limited = Response::builder()
        .status(429)
        .header("retry-after", "2")
        .body(())
        .unwrap();
    let f = limited.in_band_failure().unwrap();
    assert_eq!(f.kind, ErrorKind::RateLimited);
    assert_eq!(f.retry_after, Some(Duration::from_secs(2)));

    for status in [408, 425] {
        let early = Response::builder()
            .status(status)
            .header("retry-after", "4")
            .body(())
            .unwrap();
        let f = early.in_band_failure().unwrap();
        assert_eq!(f.kind, ErrorKind::UpstreamUnavailable, "{status}");
        assert_eq!(f.retry_after, Some(Duration::from_secs(4)), "{status}");
    }

    // An HTTP-date form parsed by the client side is left as a `RetryAfter` extension.
    let mut dated = Response::builder()
        .status(503)
        .header("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")
        .body(())
        .unwrap();
    assert_eq!(dated.in_band_failure().unwrap().retry_after, None);
    dated
        .extensions_mut()
        .insert(RetryAfter(Duration::from_secs(3)));
    let f = dated.in_band_failure().unwrap();
    assert_eq!(f.kind, ErrorKind::UpstreamUnavailable);
    assert_eq!(f.retry_after, Some(Duration::from_secs(3)));

    let not_found = Response::builder().status(404).body(()).unwrap();
    assert_eq!(
        not_found.in_band_failure().unwrap().kind,
        ErrorKind::NotFound
    );
}

#[tokio::test]
async fn the_error_layer_notes_an_http_date_retry_after() {
    use tower::{service_fn, Layer, ServiceExt};
    let in_three_secs =
        httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3));
    let client = service_fn(move |_req: Request<()>| {
        let date = in_three_secs.clone();
        async move {
            Ok::<_, std::io::Error>(
                Response::builder()
                    .status(503)
                    .header("retry-after", date)
                    .body(())
                    .unwrap(),
            )
        }
    });
    let svc = toolshield_http::HttpErrorLayer::new().layer(client);
    let res = svc
        .oneshot(Request::get("http://x/").body(()).unwrap())
        .await
        .unwrap();
    let wait = res.in_band_failure().unwrap().retry_after.unwrap();
    assert!(
        wait > Duration::from_secs(1) && wait <= Duration::from_secs(3),
        "{wait:?}"
    );
}

#[tokio::test]
async fn the_error_layer_maps_client_errors() {
    use tower::{service_fn, Layer, ServiceExt};
    let timed_out = service_fn(|_req: Request<()>| async {
        Err::<Response<()>, _>(std::io::Error::new(std::io::ErrorKind::TimedOut, "slow"))
    });
    let err = toolshield_http::HttpErrorLayer::new()
        .layer(timed_out)
        .oneshot(Request::get("http://x/").body(()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(std::error::Error::source(&err).is_some());

    // tower's own timeout, outside the client: TIMEOUT as well, for a POST too (it is
    // not a lost connection).
    for kind in [CallKind::Idempotent, CallKind::Mutating] {
        let err = toolshield_http::client_error_for(kind, tower::timeout::error::Elapsed::new());
        assert_eq!(err.kind(), ErrorKind::Timeout, "{kind:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn tower_timeout_under_the_error_layer_is_timeout() {
    use tower::timeout::TimeoutLayer;
    use tower::{service_fn, Layer, ServiceExt};
    // A client that answers after a minute, under tower's own timeout, under the error
    // layer: tower's `Elapsed` (boxed, as tower returns it) reaches the mapping.
    let slow = service_fn(|_req: Request<()>| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, std::io::Error>(Response::new(()))
    });
    let client = TimeoutLayer::new(Duration::from_secs(1)).layer(slow);
    for method in [Method::GET, Method::POST] {
        let req = Request::builder()
            .method(method.clone())
            .uri("http://x/")
            .body(())
            .unwrap();
        let err = toolshield_http::HttpErrorLayer::new()
            .layer(client.clone())
            .oneshot(req)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{method}");
        assert!(err.kind().is_retriable(), "{method}");
        let source = std::error::Error::source(&err).expect("kept as the source");
        assert_eq!(source.to_string(), "request timed out", "{method}");
    }
}

#[tokio::test]
async fn bodies_are_buffered_once_within_the_limit() {
    use http_body_util::BodyExt;
    use tower::{service_fn, Layer, ServiceExt};

    let req = Request::post("http://x/")
        .body(String::from("hello"))
        .unwrap();
    let buffered = toolshield_http::buffer_request(req, 16).await.unwrap();
    let copy = buffered.clone();
    let bytes = copy.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"hello");

    let big = Request::post("http://x/").body("x".repeat(17)).unwrap();
    let err = toolshield_http::buffer_request(big, 16).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);

    // The layer hands the inner service a clonable request with the same bytes.
    let inner = service_fn(|req: toolshield_http::BufferedRequest| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        Ok::<_, toolshield_core::ToolError>(Response::new(body))
    });
    let svc = toolshield_http::BufferBodyLayer::new(1024).layer(inner);
    let res = svc
        .oneshot(
            Request::post("http://x/")
                .body(String::from("payload"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(&res.body()[..], b"payload");
}

#[test]
fn statuses_outside_100_to_599_are_server_errors_not_successes() {
    // RFC 9110 section 15: a client that receives a status outside 100..=599 should
    // process the response as if it had a 5xx status. A response of 600..=999 is a
    // failure, never a success the stack would cache or count as healthy.
    for code in [600, 700, 799, 999] {
        let status = StatusCode::from_u16(code).unwrap();
        assert_eq!(
            http_status_kind(status),
            Some(ErrorKind::ExecutionFailed),
            "{code}"
        );
        let res = Response::builder().status(status).body(()).unwrap();
        assert_eq!(
            res.in_band_failure().map(|f| f.kind),
            Some(ErrorKind::ExecutionFailed),
            "{code}"
        );
    }
}

#[test]
fn several_retry_after_lines_on_a_raw_response_give_their_longest_wait() {
    // No adapter layer in front: the stack reads the header itself.
    for values in [["0", "120"], ["120", "0"]] {
        let mut res = Response::builder().status(503);
        for v in values {
            res = res.header(http::header::RETRY_AFTER, v);
        }
        let res = res.body(()).unwrap();
        assert_eq!(
            res.in_band_failure().unwrap().retry_after,
            Some(Duration::from_secs(120)),
            "{values:?}"
        );
    }
    let res = Response::builder()
        .status(429)
        .header(http::header::RETRY_AFTER, "soon")
        .header(http::header::RETRY_AFTER, "7")
        .body(())
        .unwrap();
    assert_eq!(
        res.in_band_failure().unwrap().retry_after,
        Some(Duration::from_secs(7)),
        "a value that does not parse is ignored"
    );
}
