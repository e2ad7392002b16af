#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
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
//! - `POST /admin/reload` (with [`ShieldRouter::reload_with`] and the same token): a new
//!   configuration for the running stack, from the body (TOML or JSON) or, with no
//!   body, from the server's file; 200 with a summary, 422 with every problem.
//!
//! [`ShieldRouter::breakers`] takes every [`BreakerRegistry`](toolshield_breaker::BreakerRegistry)
//! of a stack in one call ([`BreakerRegistries`]): `.breakers(shield.breakers())` for a
//! shield built from a configuration, or a single registry.
//!
//! Protecting handlers: [`ToolErrorResponseLayer`] answers the errors of the layers around a
//! handler (breaker, timeout) with an HTTP status ([`status_for`]), a `Retry-After` where it
//! applies, and a JSON body ([`error_response`]); [`MatchedPathKey`] gives each route its own
//! breaker and [`HandlerClassifier`] counts only a handler's 5xx and errors. See the
//! layer's example and `docs/axum.md`.

mod admin;
mod error_response;
mod handler;
mod health;
mod registries;
mod reload;
mod router;
mod status;

pub use admin::{AdminAction, ALL_KEYS};
pub use error_response::{ResponseFuture, ToolErrorResponse, ToolErrorResponseLayer};
pub use handler::{HandlerClassifier, MatchedPathKey, UNMATCHED_ROUTE_KEY};
pub use health::{CheckFuture, Component, ComponentStatus, HealthCheck, HealthReport, Importance};
pub use registries::{BreakerRegistries, DEFAULT_REGISTRY};
pub use reload::{ReloadSource, MAX_RELOAD_BODY};
pub use router::{ShieldRouter, ADMIN_TOKEN_ENV, DEFAULT_CHECK_TIMEOUT};
pub use status::{error_response, status_for};
