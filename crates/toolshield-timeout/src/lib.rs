//! Timeouts for tool calls: a hard limit per attempt, a deadline for the whole call, and
//! a soft threshold that marks slow calls without failing them.
//!
//! In the default stack the [`DeadlineLayer`] sits outside retry (its deadline is written
//! on the request, and retry never starts a wait that ends past it) and the
//! [`TimeoutLayer`] sits inside the breaker, right around the tool, so every attempt gets
//! a fresh budget (the whole order: `docs/layer-order.md`).
//!
//! On expiry the inner future is dropped at once (the tool's work is aborted), the
//! request's attempt token is cancelled (the tool may watch it), and the error is
//! `TIMEOUT`. A success slower than the soft threshold carries a
//! [`SlowCall`](toolshield_contract::SlowCall) mark (and `provenance.slow` on a
//! `toolshield_core::ToolResponse`); the breaker counts it towards its
//! slow-call rate.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use serde_json::json;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
//! use toolshield_timeout::{DeadlineLayer, TimeoutLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let slow_tool = service_fn(|_req: ToolRequest| async {
//!     tokio::time::sleep(Duration::from_secs(60)).await;
//!     Ok::<_, ToolError>(ToolResponse::new(json!("late")))
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new(Duration::from_secs(10)))
//!     .layer(TimeoutLayer::new(Duration::from_secs(4)).soft_threshold(Duration::from_secs(2)))
//!     .service(slow_tool);
//! let err = svc.oneshot(ToolRequest::new("search", json!({"q": "rust"}))).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Timeout);
//! # }
//! ```

mod config;
mod future;
mod layer;
mod service;

pub use config::TimeoutConfig;
pub use future::ResponseFuture;
pub use layer::{DeadlineLayer, TimeoutLayer};
pub use service::{Deadline, Timeout};
