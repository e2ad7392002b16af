//! What every generic toolshield layer shares, and nothing more.
//!
//! - [`ToolError`] with a closed [`ErrorKind`]: the one error type of the stack. tower's
//!   [`BoxError`] converts into it by looking at what it holds ([`ToolError::from_boxed`]):
//!   tower's `Elapsed` is `TIMEOUT`, `Overloaded` is `UPSTREAM_UNAVAILABLE`, a refused
//!   connection is `CONNECTION_FAILED`, a boxed `ToolError` is itself. So the generic
//!   layers stack with tower's own middleware (`Buffer`, `Timeout`, `LoadShed`) with no
//!   `map_err`.
//! - [`ShieldRequest`] and [`ShieldResponse`]: what a layer asks of a request and a
//!   response. Every method has a default, so any type can be a request; the per-call
//!   state ([`CallState`]: tokens, deadline, attempt) travels with the request where the
//!   type has room for it.
//! - [`Classify`] and [`Outcome`]: what a result means to retry and breaker.
//! - [`config`]: configuration errors that list every problem, and duration bounds.
//! - [`panic`]: a layer that turns a panic into an `INTERNAL` error.
//!
//! The tool-call types (`ToolRequest`, `ToolResponse`, `Provenance`, canonical JSON)
//! live in `toolshield-core`, which re-exports all of this crate. A layer that works on
//! any request type depends on this crate only, so taking one layer pulls a handful of
//! crates.
//!
//! # Features
//!
//! - `http`: `http::Request<B>` and `http::Response<B>` as requests and responses.
//! - `serde`: `Serialize`/`Deserialize` for [`ErrorKind`] and [`CallKind`], and the
//!   duration format of configuration files ([`config::duration`]).
//! - `hash`: the seeded hash maps of the breaker registry and the stores (module `hash`).
//! - `serde_json`: `serde_json::Value` as a request and response, and
//!   `From<serde_json::Error>` for [`ToolError`].
//!
//! # Example
//!
//! ```
//! use toolshield_contract::{BoxError, ErrorKind, ToolError};
//!
//! let from_tower: BoxError = Box::new(tower::timeout::error::Elapsed::new());
//! assert_eq!(ToolError::from(from_tower).kind(), ErrorKind::Timeout);
//!
//! let refused: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
//! assert_eq!(ToolError::from(refused).kind(), ErrorKind::ConnectionFailed);
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod classify;
pub mod config;
mod error;
#[cfg(feature = "hash")]
pub mod hash;
#[cfg(feature = "http")]
pub mod http_impls;
mod kind;
pub mod panic;
mod state;
pub mod time;
mod tokens;
mod traits;

pub use classify::{Classify, DefaultClassifier, Failure, Outcome};
pub use config::{ConfigError, ConfigProblem};
pub use error::{ErrorKind, ToolError};
pub use kind::CallKind;
pub use state::CallState;
pub use tokens::{AttemptGuard, CallTokens};
pub use traits::{CallMeta, InBandFailure, ShieldRequest, ShieldResponse, SlowCall};

/// tower's boxed error, which the generic layers accept from inner services and convert
/// with [`ToolError::from_boxed`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
