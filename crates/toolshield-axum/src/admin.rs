//! `/admin/breakers`: status and manual control, behind a bearer token.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use subtle::ConstantTimeEq;
use toolshield_breaker::{BreakerRegistry, BreakerStatus};

use crate::registries::{BreakerRegistries, DEFAULT_REGISTRY};

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
    pub(crate) registries: BreakerRegistries,
    pub(crate) token: Arc<[u8]>,
    pub(crate) reload: Option<crate::reload::ReloadFn>,
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
    // `Bearer 1*SP token` (RFC 6750 2.1); the scheme is case-insensitive (RFC 7235 2.1).
    let Some((scheme, rest)) = value.split_at_checked(b"Bearer ".len()) else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case(b"Bearer ") {
        return false;
    }
    let given = rest.trim_ascii_start();
    same_secret(given, expected)
}

/// Whether `given` equals `expected`, in a time that depends on `expected`'s length
/// alone: neither the first difference nor the length of the token expected shows in
/// how long a wrong guess takes (`subtle`'s slice comparison returns at once when the
/// lengths differ, which would let a caller find the length by timing).
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let mut same = (given.len() as u64).ct_eq(&(expected.len() as u64));
    for (i, e) in expected.iter().enumerate() {
        same &= given.get(i).copied().unwrap_or(!*e).ct_eq(e);
    }
    same.into()
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn only_the_exact_token_matches() {
        let token = b"s3cret-token";
        assert!(same_secret(token, token));
        for wrong in [
            &b""[..],
            b"s3cret",
            b"s3cret-token!",
            b"s3cret-tokeN",
            b"S3cret-token",
            b"s3cret-token\0",
        ] {
            assert!(!same_secret(wrong, token), "{wrong:?}");
        }
        assert!(!same_secret(b"x", b""));
        assert!(same_secret(b"", b""));
    }
}

pub(crate) async fn require_token(
    State(state): State<AdminState>,
    req: Request,
    next: Next,
) -> Response {
    if token_matches(&state.token, req.headers().get(header::AUTHORIZATION)) {
        return next.run(req).await;
    }
    unauthorized(req.uri().path())
}

/// The answer to a request without the right token: a JSON 401 with `WWW-Authenticate`.
fn unauthorized(path: &str) -> Response {
    tracing::warn!(
        target: "toolshield::admin",
        path,
        "admin request refused: missing or wrong bearer token"
    );
    let mut resp = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// A method an admin route does not take: 401 without the token (a caller without it is
/// told nothing about the routes), else a JSON 405 naming the methods in `Allow`. A
/// route's method fallback is not behind its route layer: the token is checked here.
fn wrong_method(state: &AdminState, req: &Request, allow: &'static str) -> Response {
    if !token_matches(&state.token, req.headers().get(header::AUTHORIZATION)) {
        return unauthorized(req.uri().path());
    }
    let mut resp = error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("method not allowed here (allowed: {allow})"),
    );
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    resp
}

/// The method fallback of the `GET` admin routes.
pub(crate) async fn only_get(State(state): State<AdminState>, req: Request) -> Response {
    wrong_method(&state, &req, "GET,HEAD")
}

/// The method fallback of the `POST` admin routes.
pub(crate) async fn only_post(State(state): State<AdminState>, req: Request) -> Response {
    wrong_method(&state, &req, "POST")
}

/// A path below `/admin/breakers/{key}/{action}/`: most likely a key with a `/` sent
/// unencoded. A JSON 404 saying how to send it (behind the token like every admin route).
pub(crate) async fn too_deep() -> Refusal {
    refuse(
        StatusCode::NOT_FOUND,
        "no such admin route: a key containing `/` is sent percent-encoded (`%2F`)",
    )
}

/// A path with an empty key (`/admin/breakers/`, `/admin/breakers//open`): a JSON 404
/// naming what is missing, behind the token like every admin route, rather than the
/// application's fallback.
pub(crate) async fn no_key() -> Refusal {
    refuse(
        StatusCode::NOT_FOUND,
        "no breaker key in the path: use /admin/breakers/{key} or /admin/breakers/{key}/{action}",
    )
}

/// A path with an empty action or a trailing slash (`/admin/breakers/{key}/`,
/// `/admin/breakers/{key}/{action}/`): a JSON 404 naming the routes, behind the token like
/// every admin route, rather than the application's fallback.
pub(crate) async fn no_action() -> Refusal {
    refuse(
        StatusCode::NOT_FOUND,
        "no such admin route: use GET /admin/breakers/{key} or POST /admin/breakers/{key}/{action} (open, close, metrics-only or reset), without a trailing slash",
    )
}

/// The path parameters of an admin route, or a JSON 400 when they cannot be decoded (a
/// key that is not UTF-8 once percent-decoded, for instance).
fn path_params<T>(path: Result<Path<T>, PathRejection>) -> Result<T, Refusal> {
    match path {
        Ok(Path(t)) => Ok(t),
        Err(e) => Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("invalid path: {}", e.body_text()),
        )),
    }
}

/// One breaker in an answer: its registry and its status.
#[derive(Serialize)]
struct Entry<'a> {
    registry: &'a str,
    #[serde(flatten)]
    status: BreakerStatus,
}

/// A refused admin request, answered `{"error": message}` with its status. Small, so a
/// `Result` carrying it stays cheap to move.
pub(crate) struct Refusal {
    status: StatusCode,
    message: Cow<'static, str>,
}

fn refuse(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Refusal {
    Refusal {
        status,
        message: message.into(),
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error(self.status, &self.message)
    }
}

const NO_SUCH_REGISTRY: &str = "no breaker registry with this name";

/// The query parameters of the admin API.
#[derive(Debug, Default)]
struct Params {
    /// `create=true`: an action on a key no registry holds creates its breaker.
    create: bool,
    /// `registry=NAME`: only the registries of that name.
    registry: Option<String>,
}

/// Parses `registry=NAME` (and `create=true|false` where `allow_create`); anything else,
/// a parameter given twice, or a value that is not valid, is a 400: a misspelt
/// `create` must never be taken for "do not create", nor for "create".
fn params(query: Option<&str>, allow_create: bool) -> Result<Params, Refusal> {
    let mut out = Params::default();
    let mut create_seen = false;
    let bad = |message: String| refuse(StatusCode::BAD_REQUEST, message);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)
            .ok_or_else(|| bad(format!("invalid percent-encoding in `{name}`")))?;
        match name {
            "create" if allow_create && !create_seen => {
                create_seen = true;
                out.create = match value.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("`create` must be `true` or `false`".to_owned())),
                };
            }
            "registry" if out.registry.is_none() && !value.is_empty() => {
                out.registry = Some(value);
            }
            "create" | "registry" => {
                return Err(bad(format!(
                    "`{name}` given twice, empty or not allowed here"
                )));
            }
            _ => {
                let known = if allow_create {
                    "create, registry"
                } else {
                    "registry"
                };
                return Err(bad(format!("unknown query parameter (known: {known})")));
            }
        }
    }
    Ok(out)
}

/// Decodes `%XX` and `+` of a query value; `None` for a bad escape or invalid UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(s.len());
    let mut it = s.bytes();
    while let Some(b) = it.next() {
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hi = char::from(it.next()?).to_digit(16)?;
                let lo = char::from(it.next()?).to_digit(16)?;
                bytes.push(u8::try_from(hi * 16 + lo).ok()?);
            }
            _ => bytes.push(b),
        }
    }
    String::from_utf8(bytes).ok()
}

type Named<'a> = (&'a str, &'a BreakerRegistry);

/// The registries a request addresses: every one, or those named by `registry=`.
fn selected<'a>(
    registries: &'a BreakerRegistries,
    params: &Params,
) -> Result<Vec<Named<'a>>, Refusal> {
    let chosen: Vec<_> = registries
        .iter()
        .filter(|(n, _)| params.registry.as_deref().is_none_or(|want| *n == want))
        .collect();
    if chosen.is_empty() && params.registry.is_some() {
        return Err(refuse(StatusCode::NOT_FOUND, NO_SUCH_REGISTRY));
    }
    Ok(chosen)
}

/// The registry `?create=true` creates an unknown `key` in: the one named by
/// `registry=`, else the one named like the key (a tool with breaker settings of its own
/// has a registry named after it), else [`DEFAULT_REGISTRY`], else the only one.
fn creation_target<'a>(
    registries: &'a BreakerRegistries,
    params: &Params,
    key: &str,
) -> Result<Named<'a>, Refusal> {
    let found = |name: &str| registries.iter().find(|(n, _)| *n == name);
    match &params.registry {
        Some(name) => found(name).ok_or_else(|| refuse(StatusCode::NOT_FOUND, NO_SUCH_REGISTRY)),
        None => found(key)
            .or_else(|| found(DEFAULT_REGISTRY))
            .or_else(|| {
                (registries.len() == 1)
                    .then(|| registries.iter().next())
                    .flatten()
            })
            .ok_or_else(|| {
                refuse(
                    StatusCode::BAD_REQUEST,
                    "several breaker registries and none named `default`: pass registry=NAME",
                )
            }),
    }
}

fn statuses<'a>(chosen: &[Named<'a>], key: Option<&str>) -> Vec<Entry<'a>> {
    chosen
        .iter()
        .flat_map(|(name, r)| {
            let list = match key {
                None => r.status_all(),
                Some(k) => r.status(k).into_iter().collect(),
            };
            list.into_iter().map(|status| Entry {
                registry: name,
                status,
            })
        })
        .collect()
}

pub(crate) async fn list(
    State(state): State<AdminState>,
    RawQuery(query): RawQuery,
) -> Result<Response, Refusal> {
    let params = params(query.as_deref(), false)?;
    let chosen = selected(&state.registries, &params)?;
    Ok(Json(json!({ "breakers": statuses(&chosen, None) })).into_response())
}

pub(crate) async fn one(
    State(state): State<AdminState>,
    key: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, Refusal> {
    let key = path_params(key)?;
    let params = params(query.as_deref(), false)?;
    let chosen = selected(&state.registries, &params)?;
    let found = statuses(&chosen, Some(&key));
    if found.is_empty() {
        return Err(refuse(StatusCode::NOT_FOUND, "no breaker with this key"));
    }
    Ok(Json(json!({ "key": key, "breakers": found })).into_response())
}

fn apply(r: &BreakerRegistry, action: AdminAction, key: Option<&str>) {
    match (action, key) {
        (AdminAction::Open, Some(k)) => r.force_open(k),
        (AdminAction::Close, Some(k)) => r.force_closed(k),
        (AdminAction::MetricsOnly, Some(k)) => r.metrics_only(k),
        (AdminAction::Reset, Some(k)) => r.reset(k),
        (AdminAction::Open, None) => r.force_open_all(),
        (AdminAction::Close, None) => r.force_closed_all(),
        (AdminAction::MetricsOnly, None) => r.metrics_only_all(),
        (AdminAction::Reset, None) => r.reset_all(),
    }
}

pub(crate) async fn act(
    State(state): State<AdminState>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, Refusal> {
    let (key, action) = path_params(path)?;
    let action = AdminAction::parse(&action).ok_or_else(|| {
        refuse(
            StatusCode::NOT_FOUND,
            "unknown action: use open, close, metrics-only or reset",
        )
    })?;
    let params = params(query.as_deref(), true)?;
    let chosen = selected(&state.registries, &params)?;
    let all = key == ALL_KEYS;
    if all && params.create {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "`create` needs a key: `all` means every breaker held",
        ));
    }
    // Every registry that holds the key (a per-caller key may be in several). An unknown
    // key is created only on request, so a typo cannot leave a breaker behind. (A breaker
    // evicted between this check and the action is created again: it existed a moment
    // ago, and eviction only takes idle breakers without an override.)
    let mut created = false;
    let targets: Vec<Named<'_>> = if all {
        chosen
    } else {
        let holders: Vec<_> = chosen
            .into_iter()
            .filter(|(_, r)| r.status(&key).is_some())
            .collect();
        if !holders.is_empty() {
            holders
        } else if params.create {
            // A call with a longer key runs under the registry's overflow breaker, never
            // under one of its own: an override of such a key would never reach a call.
            if key.len() > toolshield_breaker::MAX_KEY_LEN {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "a breaker key is at most {} bytes: no call has a longer one",
                        toolshield_breaker::MAX_KEY_LEN
                    ),
                ));
            }
            let target = creation_target(&state.registries, &params, &key)?;
            // Within the registry's bound: a breaker under an override is never evicted,
            // so keys created one request at a time would otherwise grow it without end.
            if !target.1.insert(&key) {
                return Err(refuse(
                    StatusCode::CONFLICT,
                    format!(
                        "registry `{}` holds its max_keys ({}) breakers and none is idle: no room for another key",
                        target.0,
                        target.1.config().max_keys
                    ),
                ));
            }
            created = true;
            vec![target]
        } else {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "no breaker with this key (pass create=true to create it)",
            ));
        }
    };
    let one_key = (!all).then_some(key.as_str());
    for (_, r) in &targets {
        apply(r, action, one_key);
    }
    let registries: Vec<&str> = targets.iter().map(|(n, _)| *n).collect();
    tracing::warn!(
        target: "toolshield::admin",
        key = key.as_str(),
        action = action.as_str(),
        registries = ?registries,
        created,
        "breaker override through the admin api"
    );
    Ok(Json(json!({
        "key": key,
        "action": action,
        "created": created,
        "breakers": statuses(&targets, one_key),
    }))
    .into_response())
}
