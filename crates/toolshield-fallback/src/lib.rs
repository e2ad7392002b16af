//! Ordered fallback chains.
//!
//! When the primary service fails in a way a fallback can fix (by default: its breaker is
//! open, or its retries are exhausted on a retriable error), the call is handed to the
//! next tier: a mirror, a cheaper model, a cached snapshot service. Each tier has its own
//! predicate (which failures hand over to it) and its own shield (wrap the tier's service
//! in whatever layers it needs before adding it). Provenance records which tier answered
//! (`provenance.tier`). When every tier fails, the error lists each tier's error, and an
//! optional escalation hook lets the application decide: retry the tiers, skip with a
//! substitute result, or abort. A retried round asks the tiers' predicates again and never
//! sends a mutation back to a tier it may have run on; a hook that panics ends the call
//! with `INTERNAL`.
//!
//! Each hand-over is a `tracing` event (tool, from, to, code) and is counted in
//! [`FallbackStats`], which the metrics layer exports.
//!
//! In the default stack it sits inside idempotency (a mutation keeps one claim whichever
//! tier runs it) and outside retry (a tier takes over only after the primary's retries);
//! the whole order: `docs/layer-order.md`.
//!
//! The primary path makes no allocation; the tiers are boxed services (heterogeneous
//! types), so a hand-over allocates, which only happens on failure.
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//! use tower::{service_fn, Layer, ServiceExt};
//! use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
//! use toolshield_fallback::FallbackLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let primary = service_fn(|_req: ToolRequest| async {
//!     Err::<ToolResponse, _>(ToolError::new(ErrorKind::CircuitOpen, "circuit open for tool `llm`"))
//! });
//! let cheaper = service_fn(|_req: ToolRequest| async {
//!     Ok::<_, ToolError>(ToolResponse::new(json!("answer from the small model")))
//! });
//! let svc = FallbackLayer::new().tier("small-model", cheaper).layer(primary);
//! let res = svc.oneshot(ToolRequest::new("llm", json!({"prompt": "hi"}))).await.unwrap();
//! assert_eq!(res.provenance.tier.as_deref(), Some("small-model"));
//! # }
//! ```

mod future;
mod layer;
mod policy;
mod service;
mod shared;
mod stats;

pub use future::ResponseFuture;
pub use layer::FallbackLayer;
pub use policy::{default_hand_over, Escalation, FallbackFailure};
pub use service::Fallback;
pub use stats::FallbackStats;
