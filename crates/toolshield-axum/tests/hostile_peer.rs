//! What an HTTP client of a protected handler sees when the handler's service fails: the
//! status of its kind, and never the server's internal text.

mod support;

use std::future::Ready;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use toolshield_axum::ToolErrorResponseLayer;
use tower::Layer;

/// A handler service that fails with an error of another library (a database driver's,
/// say), whose text names internals: a connection string with its password.
#[derive(Clone)]
struct Failing;

impl tower::Service<Request<Body>> for Failing {
    type Response = Response;
    type Error = std::io::Error;
    type Future = Ready<Result<Response, std::io::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        std::future::ready(Err(std::io::Error::other(
            "connect postgres://billing:hunter2@10.0.4.7/prod failed",
        )))
    }
}

#[tokio::test]
async fn an_error_that_is_not_a_tool_error_never_reaches_the_client_as_text() {
    // `ToolErrorResponseLayer` takes any error tower takes. One that is not a
    // `ToolError` was never written for a client: like a panic's text, it is the
    // server's internal detail, and belongs in the log.
    let svc = ToolErrorResponseLayer::new().layer(Failing);
    let app = Router::new().route_service("/charge", svc);
    let addr = support::serve(app.route("/ok", post(|| async { "ok" }))).await;
    let answer = support::request("POST", format!("http://{addr}/charge"), None).await;
    assert_eq!(answer.status, 500);
    let body = answer.json();
    assert!(!answer.body.contains("hunter2"), "{}", answer.body);
    assert!(!answer.body.contains("10.0.4.7"), "{}", answer.body);
    assert!(body["error"]["code"].is_string());
}
