//! Breaker decisions for server handlers: which breaker a request goes to
//! ([`MatchedPathKey`]) and which of a handler's answers count against it
//! ([`HandlerClassifier`]).

use std::borrow::Cow;

use axum::extract::MatchedPath;
use toolshield_breaker::KeyFn;
use toolshield_core::{Classify, DefaultClassifier, Failure, Outcome, ShieldResponse, ToolError};

/// The breaker key of a request that reached no route: with `Router::layer` (which runs
/// before routing) every request has it; use `Router::route_layer` for one breaker per
/// route.
pub const UNMATCHED_ROUTE_KEY: &str = "unmatched";

/// Keys a breaker on the route template a request matched (`/users/{id}`), from axum's
/// [`MatchedPath`]: one breaker per route when one
/// [`BreakerLayer`](toolshield_breaker::BreakerLayer) is shared by several routes.
///
/// Without it a server request is keyed on its URI host, which a server's requests do not
/// carry, so every route shares one breaker. The template, not the path, keeps the number of
/// breakers bounded whatever the clients send. A request that matched no route (a layer
/// added with `Router::layer`) is keyed [`UNMATCHED_ROUTE_KEY`]. The method is not part of
/// the key: `GET` and `POST` on one path share a breaker.
#[derive(Debug, Clone, Copy, Default)]
pub struct MatchedPathKey;

impl<B> KeyFn<axum::http::Request<B>> for MatchedPathKey {
    fn key<'r>(&self, req: &'r axum::http::Request<B>) -> Cow<'r, str> {
        Cow::Borrowed(
            req.extensions()
                .get::<MatchedPath>()
                .map_or(UNMATCHED_ROUTE_KEY, MatchedPath::as_str),
        )
    }
}

/// Classifies a handler's answers for a breaker on the server side: a 5xx response is a
/// failure of its kind (500 `EXECUTION_FAILED`, 502/503/504 `UPSTREAM_UNAVAILABLE`), an
/// error is classified by its kind (a `TIMEOUT` counts), and every other response, 4xx
/// included, says nothing about the handler's health and is ignored.
///
/// The [`DefaultClassifier`] is made for calls *out*: there a 401, 403 or 429 from the
/// tool says the tool refuses us, and counts. On a server these statuses are about the
/// client (a bad token, a client over its quota), and counting them would let one client
/// open the breaker for every other.
#[derive(Debug, Clone, Copy, Default)]
pub struct HandlerClassifier;

impl<B> Classify<axum::http::Response<B>> for HandlerClassifier {
    fn classify(&self, result: &Result<axum::http::Response<B>, ToolError>) -> Outcome {
        match result {
            Ok(response) if response.status().is_server_error() => {
                match response.in_band_failure() {
                    Some(f) => Outcome::Failure(Failure {
                        retry_after: f.retry_after,
                        ..Failure::of_kind(f.kind)
                    }),
                    None => Outcome::Success,
                }
            }
            Ok(response) if response.status().is_client_error() => Outcome::Ignored,
            Ok(_) => Outcome::Success,
            Err(e) => DefaultClassifier::classify_error(e),
        }
    }
}
