//! `HttpTool`'s errors for error statuses, against a real server: `Retry-After` (RFC 9110
//! §10.2.3, delay-seconds or an HTTP-date) is read in both forms and its edge cases, and
//! kept only where it means "come back later": on a 429 and on the retriable 5xx/408/425
//! statuses, never on a 4xx or 500 that will fail the same way again.

use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::json;
use toolshield_core::config::MAX_DURATION;
use toolshield_core::{ErrorKind, ToolError};
use toolshield_http::{http_tool_request, HttpTool};
use tower::ServiceExt;

/// Answers with the status of `x-answer-status` and, when the request has one, the
/// `x-answer-retry-after` value as `Retry-After`.
async fn answer(headers: HeaderMap) -> Response {
    let status = headers
        .get("x-answer-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let mut res = status.into_response();
    if let Some(ra) = headers.get("x-answer-retry-after") {
        res.headers_mut().insert("retry-after", ra.clone());
    }
    res
}

async fn server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, Router::new().fallback(answer)).await;
    });
    addr
}

async fn error_of(addr: std::net::SocketAddr, status: u16, retry_after: Option<&str>) -> ToolError {
    let mut headers = json!({"x-answer-status": status.to_string()});
    if let Some(ra) = retry_after {
        headers["x-answer-retry-after"] = json!(ra);
    }
    HttpTool::new()
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/"), "headers": headers}),
        ))
        .await
        .unwrap_err()
}

#[tokio::test]
async fn retry_after_forms_on_a_429_are_read_as_rfc_9110_says() {
    let addr = server().await;
    let in_an_hour = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
    for (ra, wait) in [
        ("0", Some(Duration::ZERO)),
        ("7", Some(Duration::from_secs(7))),
        ("99999999999999", Some(MAX_DURATION)),
        ("Wed, 21 Oct 2015 07:28:00 GMT", Some(Duration::ZERO)),
        ("-5", None),
        ("1.5", None),
        ("soon", None),
    ] {
        let err = error_of(addr, 429, Some(ra)).await;
        assert_eq!(err.kind(), ErrorKind::RateLimited, "{ra}");
        assert_eq!(err.retry_after(), wait, "{ra}");
    }
    let err = error_of(addr, 429, Some(&in_an_hour)).await;
    let wait = err.retry_after().unwrap();
    assert!(
        wait > Duration::from_secs(3590) && wait <= Duration::from_secs(3600),
        "{wait:?}"
    );
    assert_eq!(error_of(addr, 429, None).await.retry_after(), None);
}

#[tokio::test]
async fn retriable_statuses_keep_their_retry_after() {
    let addr = server().await;
    for status in [408, 425, 502, 503, 504] {
        let err = error_of(addr, status, Some("9")).await;
        assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable, "{status}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(9)), "{status}");
    }
}

#[tokio::test]
async fn a_status_that_is_never_retried_carries_no_retry_after() {
    // A wait on an error that is not retried would only mislead: a fallback chain, for
    // one, reports the shortest wait among its tiers' errors.
    let addr = server().await;
    for (status, kind) in [
        (400, ErrorKind::InvalidInput),
        (401, ErrorKind::Unauthorized),
        (403, ErrorKind::Unauthorized),
        (404, ErrorKind::NotFound),
        (422, ErrorKind::InvalidInput),
        (500, ErrorKind::ExecutionFailed),
    ] {
        let err = error_of(addr, status, Some("9")).await;
        assert_eq!(err.kind(), kind, "{status}");
        assert!(!err.kind().is_retriable(), "{status}");
        assert_eq!(err.retry_after(), None, "{status}");
    }
}
