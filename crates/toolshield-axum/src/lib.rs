//! An axum router for operating toolshield: `/healthz`, `/metrics` and the breaker admin
//! API, to merge into your own app.
//!
//! - `GET /healthz` runs the registered checks concurrently, each under its own timeout,
//!   and answers `200 {"status":"ok","components":{...},"failing":[]}` when every core
//!   check passes, `503` with the same shape, `"status":"degraded"` and the failing
//!   components otherwise. Always valid JSON with `content-type: application/json`.
//!   Non-core checks (a tool probe) and open breakers are reported, never fatal; breakers
//!   as counts across every registry, never keys (keys may be caller ids).
//! - `GET /metrics` serves the Prometheus text exposition of a
//!   [`PrometheusExporter`](toolshield_metrics::PrometheusExporter).
//! - `GET /admin/breakers`, `GET /admin/breakers/{key}`,
//!   `POST /admin/breakers/{key}/{open|close|metrics-only|reset}` (`all` for every
//!   breaker of every registry; a key no registry holds is 404 unless `?create=true`):
//!   behind `Authorization: Bearer <token>`, compared in constant time; not mounted at all
//!   without a token. Every action is logged and emitted as a breaker event.
//!
//! [`ShieldRouter::breakers`] takes every [`BreakerRegistry`](toolshield_breaker::BreakerRegistry)
//! of a stack in one call ([`BreakerRegistries`]): `.breakers(shield.breakers())` for a
//! shield built from a configuration, or a single registry.
//!
//! # Example
//!
//! ```
//! use toolshield_axum::ShieldRouter;
//! use toolshield_breaker::BreakerRegistry;
//! use toolshield_metrics::local_prometheus;
//!
//! let registry = BreakerRegistry::default();
//! let router: axum::Router = ShieldRouter::new()
//!     .core_check("store", || async { Ok::<_, String>(()) })
//!     .metrics(local_prometheus())
//!     .breakers(registry)
//!     .admin_token_from_env(toolshield_axum::ADMIN_TOKEN_ENV)
//!     .build();
//! # let _ = router;
//! ```

mod admin;
mod health;
mod registries;
mod router;

pub use admin::{AdminAction, ALL_KEYS};
pub use health::{CheckFuture, Component, ComponentStatus, HealthCheck, HealthReport, Importance};
pub use registries::{BreakerRegistries, DEFAULT_REGISTRY};
pub use router::{ShieldRouter, ADMIN_TOKEN_ENV, DEFAULT_CHECK_TIMEOUT};
