//! [`ShieldRouter`]: builds the axum `Router`.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use toolshield_breaker::{BreakerRegistry, CircuitState};
use toolshield_metrics::{PrometheusExporter, PROMETHEUS_CONTENT_TYPE};

use crate::admin::{self, AdminState};
use crate::health::{self, Component, ComponentStatus, HealthCheck, Importance, Registered};

/// The timeout of a check registered without one.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The environment variable [`ShieldRouter::admin_token_from_env`] reads by default.
pub const ADMIN_TOKEN_ENV: &str = "TOOLSHIELD_ADMIN_TOKEN";

/// Builds the operations router: `/healthz`, `/metrics` and `/admin/breakers`.
///
/// - `GET /healthz` is always mounted.
/// - `GET /metrics` is mounted with [`metrics`](Self::metrics).
/// - `GET /admin/breakers`, `GET /admin/breakers/{key}` and
///   `POST /admin/breakers/{key}/{open|close|metrics-only|reset}` (`{key}` = `all` for
///   every breaker) are mounted with [`breakers`](Self::breakers) *and* an
///   [`admin_token`](Self::admin_token); without a token they do not exist (404).
#[derive(Clone, Default)]
pub struct ShieldRouter {
    checks: Vec<Registered>,
    exporter: Option<PrometheusExporter>,
    registry: Option<BreakerRegistry>,
    token: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for ShieldRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShieldRouter")
            .field(
                "checks",
                &self.checks.iter().map(|c| &c.name).collect::<Vec<_>>(),
            )
            .field("metrics", &self.exporter.is_some())
            .field("breakers", &self.registry.is_some())
            .field("admin", &self.token.is_some())
            .finish()
    }
}

#[derive(Clone)]
struct HealthState {
    checks: Arc<[Registered]>,
    registry: Option<BreakerRegistry>,
}

impl ShieldRouter {
    /// A router with no check, no metrics and no admin API.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a check; `Core` failures make `/healthz` answer 503.
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
    pub fn non_core_check<F, Fut, E>(self, name: impl Into<Arc<str>>, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display,
    {
        self.check(name, Importance::NonCore, DEFAULT_CHECK_TIMEOUT, check)
    }

    /// Serves `exporter.render()` on `GET /metrics`.
    pub fn metrics(mut self, exporter: PrometheusExporter) -> Self {
        self.exporter = Some(exporter);
        self
    }

    /// Reports open breakers in `/healthz` (non-core) and, with a token, mounts the
    /// admin API over `registry`.
    pub fn breakers(mut self, registry: BreakerRegistry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Mounts the admin API, guarded by `Authorization: Bearer <token>` (compared in
    /// constant time). An empty token mounts nothing.
    pub fn admin_token(mut self, token: impl AsRef<[u8]>) -> Self {
        let token = token.as_ref();
        self.token = (!token.is_empty()).then(|| Arc::from(token));
        self
    }

    /// [`admin_token`](Self::admin_token) from the environment variable `var` (e.g.
    /// [`ADMIN_TOKEN_ENV`]), if set and not empty.
    pub fn admin_token_from_env(self, var: &str) -> Self {
        match std::env::var(var) {
            Ok(token) => self.admin_token(token),
            Err(_) => self,
        }
    }

    /// The axum router; merge it into your app (`app.merge(router)`).
    pub fn build(self) -> Router {
        let health_state = HealthState {
            checks: self.checks.into(),
            registry: self.registry.clone(),
        };
        let mut router = Router::new().route("/healthz", get(healthz).with_state(health_state));
        if let Some(exporter) = self.exporter {
            router = router.route("/metrics", get(metrics).with_state(exporter));
        }
        if let (Some(registry), Some(token)) = (self.registry, self.token) {
            let state = AdminState { registry, token };
            let admin = Router::new()
                .route("/admin/breakers", get(admin::list))
                .route("/admin/breakers/{key}", get(admin::one))
                .route("/admin/breakers/{key}/{action}", post(admin::act))
                .route_layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    admin::require_token,
                ))
                .with_state(state);
            router = router.merge(admin);
        }
        router
    }
}

async fn healthz(State(state): State<HealthState>) -> Response {
    let mut components = health::run_checks(&state.checks).await;
    if let Some(registry) = &state.registry {
        let open: Vec<String> = registry
            .status_all()
            .into_iter()
            .filter(|s| matches!(s.state, CircuitState::Open | CircuitState::ForcedOpen))
            .map(|s| s.key.to_string())
            .collect();
        components.insert(
            "breakers".to_owned(),
            Component {
                status: if open.is_empty() {
                    ComponentStatus::Ok
                } else {
                    ComponentStatus::Degraded
                },
                core: false,
                duration_ms: None,
                error: None,
                open: Some(open),
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
    (
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        exporter.render(),
    )
        .into_response()
}
