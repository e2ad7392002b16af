//! `/admin/breakers`: status and manual control, behind a bearer token.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use subtle::ConstantTimeEq;
use toolshield_breaker::{BreakerRegistry, BreakerStatus};

/// The key that means every breaker in `POST /admin/breakers/all/{action}`.
pub const ALL_KEYS: &str = "all";

/// A manual action on a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdminAction {
    /// Force open: every call is rejected with `CIRCUIT_OPEN`.
    Open,
    /// Force closed (disabled): every call passes; it never trips.
    Close,
    /// Shadow mode: records and reports, never rejects.
    MetricsOnly,
    /// Back to a fresh closed breaker, override lifted.
    Reset,
}

impl AdminAction {
    /// Parses the path segment (`open`, `close`, `metrics-only`, `reset`).
    pub fn parse(s: &str) -> Option<AdminAction> {
        match s {
            "open" => Some(AdminAction::Open),
            "close" => Some(AdminAction::Close),
            "metrics-only" => Some(AdminAction::MetricsOnly),
            "reset" => Some(AdminAction::Reset),
            _ => None,
        }
    }

    /// The path segment.
    pub const fn as_str(self) -> &'static str {
        match self {
            AdminAction::Open => "open",
            AdminAction::Close => "close",
            AdminAction::MetricsOnly => "metrics-only",
            AdminAction::Reset => "reset",
        }
    }
}

#[derive(Clone)]
pub(crate) struct AdminState {
    pub(crate) registry: BreakerRegistry,
    pub(crate) token: Arc<[u8]>,
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// Constant-time comparison of the bearer token: the time taken does not depend on how
/// many leading bytes match (only on the length of what was sent).
pub(crate) fn token_matches(expected: &[u8], header: Option<&HeaderValue>) -> bool {
    let Some(value) = header.map(HeaderValue::as_bytes) else {
        return false;
    };
    let Some(given) = value
        .strip_prefix(b"Bearer ")
        .or_else(|| value.strip_prefix(b"bearer "))
    else {
        return false;
    };
    given.ct_eq(expected).into()
}

pub(crate) async fn require_token(
    State(state): State<AdminState>,
    req: Request,
    next: Next,
) -> Response {
    if token_matches(&state.token, req.headers().get(header::AUTHORIZATION)) {
        return next.run(req).await;
    }
    tracing::warn!(
        target: "toolshield::admin",
        path = req.uri().path(),
        "admin request refused: missing or wrong bearer token"
    );
    let mut resp = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

#[derive(Serialize)]
struct List {
    breakers: Vec<BreakerStatus>,
}

pub(crate) async fn list(State(state): State<AdminState>) -> Response {
    Json(List {
        breakers: state.registry.status_all(),
    })
    .into_response()
}

pub(crate) async fn one(State(state): State<AdminState>, Path(key): Path<String>) -> Response {
    match state.registry.status(&key) {
        Some(status) => Json(status).into_response(),
        None => error(StatusCode::NOT_FOUND, "no breaker with this key"),
    }
}

pub(crate) async fn act(
    State(state): State<AdminState>,
    Path((key, action)): Path<(String, String)>,
) -> Response {
    let Some(action) = AdminAction::parse(&action) else {
        return error(
            StatusCode::NOT_FOUND,
            "unknown action: use open, close, metrics-only or reset",
        );
    };
    let r = &state.registry;
    let all = key == ALL_KEYS;
    match (action, all) {
        (AdminAction::Open, false) => r.force_open(&key),
        (AdminAction::Close, false) => r.force_closed(&key),
        (AdminAction::MetricsOnly, false) => r.metrics_only(&key),
        (AdminAction::Reset, false) => r.reset(&key),
        (AdminAction::Open, true) => r.force_open_all(),
        (AdminAction::Close, true) => r.force_closed_all(),
        (AdminAction::MetricsOnly, true) => r.metrics_only_all(),
        (AdminAction::Reset, true) => r.reset_all(),
    }
    tracing::warn!(
        target: "toolshield::admin",
        key = key.as_str(),
        action = action.as_str(),
        "breaker override through the admin api"
    );
    let breakers = if all {
        r.status_all()
    } else {
        r.status(&key).into_iter().collect()
    };
    Json(json!({ "key": key, "action": action, "breakers": breakers })).into_response()
}
