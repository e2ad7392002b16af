//! `POST /admin/reload`: a new configuration for the running stack, behind the admin
//! token, handed to the callback given to
//! [`ShieldRouter::reload_with`](crate::ShieldRouter::reload_with).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use toolshield_core::ConfigError;

use crate::admin::AdminState;

/// What a `POST /admin/reload` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReloadSource {
    /// A TOML document: the body, sent as `application/toml` or `text/toml`.
    Toml(String),
    /// A JSON document: the body, sent as `application/json` (or `*/*+json`).
    Json(String),
    /// No body: read the configuration again from where the server got it (its file).
    File,
}

/// The reload callback: applies a configuration, answers a summary of what changed
/// (any JSON) or every problem found, in which case nothing changed.
pub(crate) type ReloadFn =
    Arc<dyn Fn(ReloadSource) -> Result<Value, ConfigError> + Send + Sync + 'static>;

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// A body that cannot be used: its status and message (small, so the `Result` is).
type Unusable = (StatusCode, &'static str);

/// The source a request asks for: `Err` is the answer to a body that cannot be used.
fn source(headers: &HeaderMap, body: &Bytes) -> Result<ReloadSource, Unusable> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(ReloadSource::File);
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return Err((StatusCode::BAD_REQUEST, "the body is not UTF-8"));
    };
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match media.as_str() {
        "application/toml" | "text/toml" => Ok(ReloadSource::Toml(text.to_owned())),
        m if m == "application/json" || m.ends_with("+json") => {
            Ok(ReloadSource::Json(text.to_owned()))
        }
        _ => Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the configuration as application/toml or application/json, or no body to reload the file",
        )),
    }
}

/// The largest body `POST /admin/reload` reads (1 MiB): a larger one is a JSON 413 and
/// the callback is not called. Set on the route itself, so a body limit the application
/// sets (or lifts) on its own routes does not change it.
pub const MAX_RELOAD_BODY: usize = 1 << 20;

pub(crate) async fn reload(
    State(state): State<AdminState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(apply) = state.reload.clone() else {
        return refuse(StatusCode::NOT_FOUND, "reload is not enabled");
    };
    let body = match body {
        Ok(body) => body,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the body is larger than the limit of 1 MiB: nothing was changed",
            );
        }
        Err(e) => return refuse(e.status(), &e.body_text()),
    };
    let source = match source(&headers, &body) {
        Ok(source) => source,
        Err((status, message)) => return refuse(status, message),
    };
    let what = match &source {
        ReloadSource::Toml(_) => "toml body",
        ReloadSource::Json(_) => "json body",
        ReloadSource::File => "file",
    };
    // A callback that panics must not take the connection down unanswered (the client,
    // the CLI included, would report an unreachable server): a JSON 500, the panic text
    // logged, never sent.
    let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| apply(source)));
    let applied = match applied {
        Ok(applied) => applied,
        Err(panic) => {
            let text = toolshield_core::panic::payload_text(&*panic);
            tracing::error!(
                target: "toolshield::admin",
                from = what,
                panic = text,
                "the reload callback panicked"
            );
            return refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error: the reload callback panicked (see the server log); whether the configuration changed is unknown",
            );
        }
    };
    match applied {
        Ok(summary) => {
            tracing::warn!(
                target: "toolshield::admin",
                from = what,
                "configuration reloaded through the admin api"
            );
            (
                StatusCode::OK,
                Json(json!({ "reloaded": true, "summary": summary })),
            )
                .into_response()
        }
        Err(e) => {
            tracing::warn!(
                target: "toolshield::admin",
                from = what,
                problems = e.problems().len(),
                "configuration reload refused: the running configuration stays"
            );
            let problems: Vec<Value> = e
                .problems()
                .iter()
                .map(|p| json!({ "field": p.field, "message": p.message }))
                .collect();
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({
                    "error": "invalid configuration: nothing was changed",
                    "problems": problems,
                })),
            )
                .into_response()
        }
    }
}
