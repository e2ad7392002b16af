//! `Retry-After` as a real server sends it (RFC 9110 §10.2.3: delay-seconds or an
//! HTTP-date), read by the client from the wire: zero, negative, huge, a date in the
//! past or the future, garbage, and a 429 or 503 without one.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolshield_core::http_impls::RetryAfter;
use toolshield_core::ErrorKind;
use tower::ServiceExt;

/// A server that answers every request with `status` and the raw `Retry-After` line
/// taken from the request's `x-answer-retry-after` header (absent: no such line).
async fn server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).into_owned();
                let header = |name: &str| {
                    text.lines().find_map(|l| {
                        let (n, v) = l.split_once(':')?;
                        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                    })
                };
                let status = header("x-answer-status").unwrap_or_else(|| "429".into());
                let mut answer = format!(
                    "HTTP/1.1 {status} Whatever\r\ncontent-length: 0\r\nconnection: close\r\n"
                );
                if let Some(ra) = header("x-answer-retry-after") {
                    answer.push_str(&format!("retry-after: {ra}\r\n"));
                }
                answer.push_str("\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

/// Asks the server for `status` with `retry_after`; returns the wait the client read.
async fn wait_for(addr: SocketAddr, status: u16, retry_after: Option<&str>) -> Option<Duration> {
    let mut req = Request::builder()
        .method(Method::GET)
        .uri(format!("http://{addr}/"))
        .header("x-answer-status", status.to_string());
    if let Some(ra) = retry_after {
        req = req.header("x-answer-retry-after", ra);
    }
    let res = toolshield_reqwest::Client::new(reqwest::Client::new())
        .oneshot(req.body(Bytes::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::from_u16(status).unwrap());
    let noted = res.extensions().get::<RetryAfter>().map(|r| r.0);
    let err = toolshield_reqwest::error_for_status(res).unwrap_err();
    assert_eq!(err.retry_after(), noted, "the error keeps the wait read");
    noted
}

#[tokio::test]
async fn delay_seconds_are_read_as_sent() {
    let addr = server().await;
    assert_eq!(wait_for(addr, 429, Some("0")).await, Some(Duration::ZERO));
    assert_eq!(
        wait_for(addr, 429, Some("7")).await,
        Some(Duration::from_secs(7))
    );
    assert_eq!(
        wait_for(addr, 503, Some("120")).await,
        Some(Duration::from_secs(120))
    );
}

#[tokio::test]
async fn a_huge_delay_is_the_longest_wait_never_an_overflow() {
    let addr = server().await;
    let longest = toolshield_core::config::MAX_DURATION;
    for ra in ["99999999999999", "184467440737095516150000"] {
        assert_eq!(wait_for(addr, 429, Some(ra)).await, Some(longest), "{ra}");
    }
}

#[tokio::test]
async fn negative_fractional_and_garbage_values_are_ignored() {
    let addr = server().await;
    for ra in [
        "-5",
        "1.5",
        "soon",
        "5 seconds",
        "0x10",
        "Wed, 99 Oct 2015 07:28:00 GMT",
    ] {
        assert_eq!(wait_for(addr, 429, Some(ra)).await, None, "{ra}");
    }
}

#[tokio::test]
async fn an_http_date_in_the_past_is_no_wait_and_one_in_the_future_the_time_until_it() {
    let addr = server().await;
    assert_eq!(
        wait_for(addr, 429, Some("Wed, 21 Oct 2015 07:28:00 GMT")).await,
        Some(Duration::ZERO)
    );
    let in_an_hour = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
    let wait = wait_for(addr, 503, Some(&in_an_hour)).await.unwrap();
    // Whole seconds on the wire, and the request takes a moment.
    assert!(
        wait > Duration::from_secs(3590) && wait <= Duration::from_secs(3600),
        "{wait:?}"
    );
}

#[tokio::test]
async fn a_429_or_503_without_retry_after_carries_no_wait_and_keeps_its_kind() {
    let addr = server().await;
    assert_eq!(wait_for(addr, 429, None).await, None);
    assert_eq!(wait_for(addr, 503, None).await, None);
    let res = toolshield_reqwest::Client::new(reqwest::Client::new())
        .oneshot(
            Request::get(format!("http://{addr}/"))
                .header("x-answer-status", "429")
                .body(Bytes::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let err = toolshield_reqwest::error_for_status(res).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert!(err.kind().is_retriable());
}

#[tokio::test]
async fn other_4xx_statuses_are_not_retriable_and_ignore_retry_after() {
    let addr = server().await;
    for (status, kind) in [
        (400, ErrorKind::InvalidInput),
        (401, ErrorKind::Unauthorized),
        (404, ErrorKind::NotFound),
        (422, ErrorKind::InvalidInput),
    ] {
        let res = toolshield_reqwest::Client::new(reqwest::Client::new())
            .oneshot(
                Request::get(format!("http://{addr}/"))
                    .header("x-answer-status", status.to_string())
                    .header("x-answer-retry-after", "5")
                    .body(Bytes::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        let err = toolshield_reqwest::error_for_status(res).unwrap_err();
        assert_eq!(err.kind(), kind, "{status}");
        assert!(!err.kind().is_retriable(), "{status}");
        assert_eq!(err.retry_after(), None, "{status}");
    }
}
