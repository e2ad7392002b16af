//! The contract every toolshield layer shares.
//!
//! - [`ToolRequest`]: what to call, with which payload, of which [`CallKind`], under which
//!   trace, with a cancellation token and an optional deadline. Cheap to clone.
//! - [`ToolResponse`]: the output and its [`Provenance`].
//! - [`ToolError`] with a closed [`ErrorKind`]: the one error type of the stack.
//! - [`Classify`] and [`Outcome`]: what a result means to retry and breaker.
//! - [`ToolResult`]: the never-throw envelope an agent reads.
//! - [`canonical`]: RFC 8785 canonical JSON and the SHA-256 keys built on it.
//! - everything of `toolshield-contract` (the error, the call state, [`ShieldRequest`] and
//!   [`ShieldResponse`], classification), re-exported.
//!
//! The layers that work on tool calls (cache, idempotency, validate, provenance, fallback)
//! build on this crate; the generic layers need only `toolshield-contract`.
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//! use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolResult};
//!
//! let req = ToolRequest::new("weather", json!({"city": "Paris", "units": "metric"}))
//!     .kind(CallKind::ReadOnly)
//!     .caller("agent-7");
//! let same = ToolRequest::new("weather", json!({"units": "metric", "city": "Paris"}));
//! assert_eq!(req.cache_key()?, same.cache_key()?);
//!
//! let ok: ToolResult = Ok::<_, ToolError>(ToolResponse::new(json!({"temp": 21}))).into();
//! assert!(ok.is_success());
//!
//! let err = ToolError::new(ErrorKind::CircuitOpen, "circuit open for tool `weather`");
//! assert!(err.for_model("weather").contains("another"));
//! # Ok::<(), ToolError>(())
//! ```

pub mod canonical;
mod envelope;
#[cfg(feature = "testing")]
pub mod faults;
pub mod keys;
mod request;
mod response;
mod service;
pub mod size;

// The contract the generic layers share, re-exported whole: `toolshield_core::ToolError`
// and `toolshield_contract::ToolError` are one type.
pub use toolshield_contract::*;
pub use toolshield_contract::{config, hash, http_impls, panic, time};

pub use canonical::{cache_key, payload_digest, Digest};
pub use envelope::{ToolResult, ToolResultError, ToolStatus};
pub use request::{RequestMeta, SharedPayload, ToolRequest};
pub use response::{Provenance, ToolResponse};
pub use service::ToolService;
