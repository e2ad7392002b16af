//! The contract every toolshield layer shares.
//!
//! - [`ToolRequest`]: what to call, with which payload, of which [`CallKind`], under which
//!   trace, with a cancellation token and an optional deadline. Cheap to clone.
//! - [`ToolResponse`]: the output and its [`Provenance`].
//! - [`ToolError`] with a closed [`ErrorKind`]: the one error type of the stack.
//! - [`Classify`] and [`Outcome`]: what a result means to retry and breaker.
//! - [`ToolResult`]: the never-throw envelope an agent reads.
//! - [`canonical`]: RFC 8785 canonical JSON and the SHA-256 keys built on it.
//! - [`ShieldRequest`] and [`ShieldResponse`]: the small traits the generic layers use.
//!
//! This crate sits under every layer; it has no middleware of its own.
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
mod classify;
pub mod config;
mod envelope;
mod error;
#[cfg(feature = "testing")]
pub mod faults;
pub mod hash;
pub mod http_impls;
pub mod keys;
mod kind;
pub mod panic;
mod request;
mod response;
pub mod size;
mod tokens;
mod traits;

pub use canonical::{cache_key, payload_digest, Digest};
pub use classify::{Classify, DefaultClassifier, Failure, Outcome};
pub use config::{ConfigError, ConfigProblem};
pub use envelope::{ToolResult, ToolResultError, ToolStatus};
pub use error::{ErrorKind, ToolError};
pub use kind::CallKind;
pub use request::{RequestMeta, ToolRequest};
pub use response::{Provenance, SlowCall, ToolResponse};
pub use tokens::{AttemptGuard, CallTokens};
pub use traits::{InBandFailure, ShieldRequest, ShieldResponse, ToolService};

/// A boxed error, for the edges that convert other crates' errors.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
