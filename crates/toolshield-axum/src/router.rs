//! [`ShieldRouter`]: builds the axum `Router`.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use toolshield_breaker::CircuitState;
use toolshield_metrics::{PrometheusExporter, PROMETHEUS_CONTENT_TYPE};

use crate::admin::{self, AdminState};
use crate::health::{
    self, Component, ComponentStatus, HealthCheck, Importance, Registered, BREAKERS_COMPONENT,
};
use crate::registries::BreakerRegistries;
use crate::reload::{self, ReloadFn, ReloadSource};
use toolshield_core::ConfigError;

/// The timeout of a check registered without one.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The environment variable [`ShieldRouter::admin_token_from_env`] reads by default.
pub const ADMIN_TOKEN_ENV: &str = "TOOLSHIELD_ADMIN_TOKEN";

/// Builds the operations router: `/healthz`, `/metrics`, `/admin/breakers` and
/// `/admin/reload`.
///
/// - `GET /healthz` is always mounted.
/// - `GET /metrics` is mounted with [`metrics`](Self::metrics).
/// - `GET /admin/breakers`, `GET /admin/breakers/{key}` and
///   `POST /admin/breakers/{key}/{open|close|metrics-only|reset}` (`{key}` = `all` for
///   every breaker of every registry) are mounted with [`breakers`](Self::breakers) *and*
///   an [`admin_token`](Self::admin_token); without a token they do not exist (404).
///   A key no registry holds is 404 for every verb; `?create=true` creates it (see
///   `docs/operations.md` for the registry it is created in), `?registry=NAME` narrows a
///   request to one registry.
/// - `POST /admin/reload` is mounted with [`reload_with`](Self::reload_with) *and* an
///   admin token: the body is the new configuration (`application/toml` or
///   `application/json`), or empty to reload the server's configuration file; 200 with a
///   summary, 422 with every problem (nothing changed), 415 for another content type,
///   413 for a body over [`MAX_RELOAD_BODY`](crate::MAX_RELOAD_BODY), 400 for a body
///   that is not UTF-8, 401 without the token.
///
/// Every admin refusal is a JSON `{"error": ...}` with a 4xx status, given only after the
/// token was checked: a method a route does not take (405), path parameters that cannot
/// be decoded (400), a path below `/admin/breakers/{key}/{action}/` (404: a key with a
/// `/` is sent percent-encoded), a path with an empty key (404).
#[derive(Clone, Default)]
pub struct ShieldRouter {
    checks: Vec<Registered>,
    exporter: Option<PrometheusExporter>,
    registries: BreakerRegistries,
    token: Option<Arc<[u8]>>,
    reload: Option<ReloadFn>,
}

impl std::fmt::Debug for ShieldRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShieldRouter")
            .field(
                "checks",
                &self.checks.iter().map(|c| &c.name).collect::<Vec<_>>(),
            )
            .field("metrics", &self.exporter.is_some())
            .field("breakers", &self.registries.names().collect::<Vec<_>>())
            .field("admin", &self.token.is_some())
            .field("reload", &self.reload.is_some())
            .finish()
    }
}

#[derive(Clone)]
struct HealthState {
    checks: Arc<[Registered]>,
    registries: BreakerRegistries,
    /// `breakers`, or `breakers#2` if a check took that name.
    breakers_name: Arc<str>,
}

impl ShieldRouter {
    /// A router with no check, no metrics and no admin API.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a check; `Core` failures make `/healthz` answer 503.
    ///
    /// A name already taken (by an earlier check, or `breakers` by the breaker counts) is
    /// reported as `NAME#2` (`#3`, ...): two components never share an entry of the report.
    #[must_use]
    pub fn check(
        mut self,
        name: impl Into<Arc<str>>,
        importance: Importance,
        timeout: Duration,
        check: impl HealthCheck,
    ) -> Self {
        self.checks.push(Registered {
            name: name.into(),
            importance,
            timeout,
            check: Arc::new(check),
        });
        self
    }

    /// Adds a core check with the [`DEFAULT_CHECK_TIMEOUT`].
    #[must_use]
    pub fn core_check<F, Fut, E>(self, name: impl Into<Arc<str>>, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display,
    {
        self.check(name, Importance::Core, DEFAULT_CHECK_TIMEOUT, check)
    }

    /// Adds a non-core check (reported, never fails `/healthz`) with the
    /// [`DEFAULT_CHECK_TIMEOUT`].
    #[must_use]
    pub fn non_core_check<F, Fut, E>(self, name: impl Into<Arc<str>>, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display,
    {
        self.check(name, Importance::NonCore, DEFAULT_CHECK_TIMEOUT, check)
    }

    /// Serves `exporter.render()` on `GET /metrics`.
    #[must_use]
    pub fn metrics(mut self, exporter: PrometheusExporter) -> Self {
        self.exporter = Some(exporter);
        self
    }

    /// Reports how many breakers are open in `/healthz` (non-core; counts only, never
    /// keys) and, with a token, mounts the admin API over every registry of `registries`.
    ///
    /// Pass every registry of the stack in one call: a shield's whole map
    /// (`.breakers(shield.breakers())`), or one [`BreakerRegistry`](toolshield_breaker::BreakerRegistry)
    /// (named [`DEFAULT_REGISTRY`](crate::DEFAULT_REGISTRY)). A second call adds its
    /// registries to those of the first; none is dropped.
    #[must_use]
    pub fn breakers(mut self, registries: impl Into<BreakerRegistries>) -> Self {
        self.registries.extend(registries.into());
        self
    }

    /// Mounts the admin API, guarded by `Authorization: Bearer <token>` (compared in
    /// constant time). Surrounding whitespace is not part of the token (a header cannot
    /// carry it: a token read from a file with its newline would never match); an empty
    /// or blank token mounts nothing.
    #[must_use]
    pub fn admin_token(mut self, token: impl AsRef<[u8]>) -> Self {
        let token = token.as_ref().trim_ascii();
        self.token = (!token.is_empty()).then(|| Arc::from(token));
        self
    }

    /// [`admin_token`](Self::admin_token) from the environment variable `var` (e.g.
    /// [`ADMIN_TOKEN_ENV`]), if set and not blank.
    #[must_use]
    pub fn admin_token_from_env(self, var: &str) -> Self {
        match std::env::var(var) {
            Ok(token) => self.admin_token(token),
            Err(_) => self,
        }
    }

    /// Mounts `POST /admin/reload` (with an [`admin_token`](Self::admin_token)): `apply`
    /// gets the [`ReloadSource`] a request asks for, applies it, and answers a summary
    /// of what changed, or every problem found (then nothing may have changed).
    ///
    /// This crate does not know the facade: with `toolshield`, the callback parses the
    /// body with `ShieldConfig::from_toml_str` / `from_json_str` (or loads the file the
    /// server started with) and calls `Shield::reload`; see `docs/reload.md`.
    #[must_use]
    pub fn reload_with<F>(mut self, apply: F) -> Self
    where
        F: Fn(ReloadSource) -> Result<serde_json::Value, ConfigError> + Send + Sync + 'static,
    {
        self.reload = Some(Arc::new(apply));
        self
    }

    /// The axum router; merge it into your app (`app.merge(router)`).
    pub fn build(self) -> Router {
        // Every component gets a name of its own: checks in the order they were added,
        // then the breaker counts; a name already taken gets `#2`, `#3`, ...
        let mut taken = BTreeSet::new();
        let checks: Arc<[Registered]> = self
            .checks
            .into_iter()
            .map(|mut c| {
                let name = health::unique_name(&mut taken, Arc::clone(&c.name));
                if name != c.name {
                    tracing::warn!(
                        target: "toolshield::health",
                        check = &*c.name,
                        reported_as = &*name,
                        "health check name already taken: reported under another name"
                    );
                }
                c.name = name;
                c
            })
            .collect();
        let breakers_name = health::unique_name(&mut taken, Arc::from(BREAKERS_COMPONENT));
        let health_state = HealthState {
            checks,
            registries: self.registries.clone(),
            breakers_name,
        };
        // A method these public routes do not take is a JSON 405 too (no token to check).
        let mut router = Router::new().route(
            "/healthz",
            get(healthz)
                .fallback(public_only_get)
                .with_state(health_state),
        );
        if let Some(exporter) = self.exporter {
            router = router.route(
                "/metrics",
                get(metrics).fallback(public_only_get).with_state(exporter),
            );
        }
        if let Some(token) = self.token {
            let breakers = !self.registries.is_empty();
            let reloads = self.reload.is_some();
            let state = AdminState {
                registries: self.registries,
                token,
                reload: self.reload,
            };
            let mut admin = Router::new();
            // Every route answers a method it does not take with a JSON 405 (401 without
            // the token), and a refused path or body with a JSON 4xx.
            if breakers {
                admin = admin
                    .route(
                        "/admin/breakers",
                        get(admin::list).fallback(admin::only_get),
                    )
                    .route(
                        "/admin/breakers/{key}",
                        get(admin::one).fallback(admin::only_get),
                    )
                    .route(
                        "/admin/breakers/{key}/{action}",
                        post(admin::act).fallback(admin::only_post),
                    )
                    .route(
                        "/admin/breakers/{key}/{action}/{*rest}",
                        any(admin::too_deep),
                    )
                    // An empty key, an empty action or a trailing slash matches no
                    // route above (a parameter never matches an empty segment): a JSON
                    // 404 here too, behind the token.
                    .route("/admin/breakers/", any(admin::no_key))
                    .route("/admin/breakers//", any(admin::no_key))
                    .route("/admin/breakers//{*rest}", any(admin::no_key))
                    .route("/admin/breakers/{key}/", any(admin::no_action))
                    .route("/admin/breakers/{key}/{action}/", any(admin::no_action));
            }
            if reloads {
                admin = admin.route(
                    "/admin/reload",
                    post(reload::reload)
                        .fallback(admin::only_post)
                        .layer(DefaultBodyLimit::max(reload::MAX_RELOAD_BODY)),
                );
            }
            if breakers || reloads {
                let admin = admin
                    .route_layer(axum::middleware::from_fn_with_state(
                        state.clone(),
                        admin::require_token,
                    ))
                    .with_state(state);
                router = router.merge(admin);
            }
        }
        router
    }
}

/// The method fallback of `/healthz` and `/metrics`: a JSON 405 with `Allow`.
async fn public_only_get() -> Response {
    let mut resp = (
        StatusCode::METHOD_NOT_ALLOWED,
        Json(serde_json::json!({ "error": "method not allowed here (allowed: GET,HEAD)" })),
    )
        .into_response();
    resp.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("GET,HEAD"));
    resp
}

async fn healthz(State(state): State<HealthState>) -> Response {
    let mut components = health::run_checks(&state.checks).await;
    if !state.registries.is_empty() {
        // Counts only: keys may be caller ids, and this endpoint has no token. Counted
        // in place, so an unauthenticated request copies no key of a full registry.
        let (mut open, mut forced_open) = (0, 0);
        for (_, registry) in state.registries.iter() {
            for (s, n) in registry.state_counts() {
                match s {
                    CircuitState::Open => open += n,
                    CircuitState::ForcedOpen => forced_open += n,
                    _ => {}
                }
            }
        }
        components.insert(
            state.breakers_name.to_string(),
            Component {
                status: if open + forced_open == 0 {
                    ComponentStatus::Ok
                } else {
                    ComponentStatus::Degraded
                },
                core: false,
                duration_ms: None,
                error: None,
                open: Some(open),
                forced_open: Some(forced_open),
            },
        );
    }
    let report = health::report(components);
    let code = if report.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(report)).into_response()
}

async fn metrics(State(exporter): State<PrometheusExporter>) -> Response {
    // A collector is the application's code: one that panics must not take the
    // connection down unanswered. A JSON 500, the panic text logged, never sent.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exporter.render())) {
        Ok(text) => ([(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)], text).into_response(),
        Err(panic) => {
            tracing::error!(
                target: "toolshield::metrics",
                panic = toolshield_core::panic::payload_text(&*panic),
                "a metrics collector panicked"
            );
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(serde_json::json!({
                    "error": "internal error: a metrics collector panicked (see the server log)"
                })),
            )
                .into_response()
        }
    }
}
