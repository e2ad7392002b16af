//! Credentials a request carries (URL user info, query tokens, an `Authorization`
//! header) never reach an error's message, its `Debug` or `Display`, its source chain, or
//! the text the model reads, whatever way the request failed.

mod support;

use std::error::Error as _;

use bytes::Bytes;
use http::Request;
use toolshield_core::{ErrorKind, ToolError};
use tower::ServiceExt;

const SECRETS: [&str; 4] = ["hunter2", "QUERYTOKEN", "FRAGTOKEN", "BEARERTOKEN"];

fn every_text_of(err: &ToolError) -> String {
    let mut text = format!(
        "{err}\n{err:?}\n{}\n{}",
        err.message(),
        err.for_model("api")
    );
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(&format!("\n{e}\n{e:?}"));
        source = e.source();
    }
    text
}

fn leaky(method: &str, addr: std::net::SocketAddr, path: &str) -> Request<Bytes> {
    Request::builder()
        .method(method)
        .uri(format!(
            "http://admin:hunter2@{addr}{path}?api_key=QUERYTOKEN#FRAGTOKEN"
        ))
        .header("authorization", "Bearer BEARERTOKEN")
        .body(Bytes::from_static(b"{}"))
        .unwrap()
}

async fn assert_clean(req: Request<Bytes>, kind: ErrorKind) {
    let err = toolshield_reqwest::Client::new(reqwest::Client::new())
        .oneshot(req)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), kind, "{err:?}");
    let text = every_text_of(&err);
    for secret in SECRETS {
        assert!(!text.contains(secret), "`{secret}` leaked: {text}");
    }
}

#[tokio::test]
async fn a_refused_connection_names_no_credential() {
    let addr = support::refusing_addr();
    assert_clean(leaky("GET", addr, "/x"), ErrorKind::ConnectionFailed).await;
}

#[tokio::test]
async fn a_connection_lost_after_a_post_names_no_credential() {
    let (addr, _) = support::start_hanging_up().await;
    assert_clean(leaky("POST", addr, "/orders"), ErrorKind::OutcomeUnknown).await;
    assert_clean(leaky("GET", addr, "/x"), ErrorKind::UpstreamUnavailable).await;
}

#[tokio::test]
async fn a_redirect_loop_names_no_credential() {
    let (addr, _) = support::start().await;
    assert_clean(leaky("GET", addr, "/loop"), ErrorKind::ExecutionFailed).await;
}

#[tokio::test]
async fn an_error_status_names_no_credential() {
    let (addr, _) = support::start().await;
    let res = toolshield_reqwest::Client::new(reqwest::Client::new())
        .oneshot(leaky("GET", addr, "/fail"))
        .await
        .unwrap();
    let err = toolshield_reqwest::error_for_status(res).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    let text = every_text_of(&err);
    for secret in SECRETS {
        assert!(!text.contains(secret), "`{secret}` leaked: {text}");
    }
}
