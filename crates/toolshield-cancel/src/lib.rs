//! Cancellation for tool calls.
//!
//! [`CancelLayer`] checks the request's call token before anything runs and races it
//! against everything inside: if the token is already cancelled the inner service is
//! never called; if it fires during the call the inner future is dropped at once and the
//! call fails with `CANCELLED`. The default classifier reports `CANCELLED` as
//! [`Outcome::Cancelled`](toolshield_contract::Outcome::Cancelled), so no breaker counts it
//! and no retry repeats it.
//!
//! In the default stack it sits outside the total deadline and everything below it, so a
//! cancelled call stops retries, backoff waits and the tool alike (the whole order:
//! `docs/layer-order.md`).
//!
//! The tool itself sees a child of the call token
//! (`toolshield_core::ToolRequest::attempt_token`), which
//! fires with it.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use serde_json::json;
//! use tokio_util::sync::CancellationToken;
//! use tower::{service_fn, Layer, ServiceExt};
//! use toolshield_cancel::CancelLayer;
//! use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let tool = service_fn(|_req: ToolRequest| async {
//!     tokio::time::sleep(Duration::from_secs(60)).await;
//!     Ok::<_, ToolError>(ToolResponse::new(json!("done")))
//! });
//! let svc = CancelLayer::new().layer(tool);
//!
//! let token = CancellationToken::new();
//! let req = ToolRequest::new("search", json!({"q": "rust"})).cancel_token(token.clone());
//! let call = tokio::spawn(svc.oneshot(req));
//! tokio::time::sleep(Duration::from_secs(1)).await;
//! token.cancel();
//! assert_eq!(call.await.unwrap().unwrap_err().kind(), ErrorKind::Cancelled);
//! # }
//! ```

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::CancelLayer;
pub use service::Cancel;
