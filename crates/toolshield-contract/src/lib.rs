#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod classify;
pub mod config;
mod error;
#[cfg(feature = "hash")]
pub mod hash;
#[cfg(feature = "http")]
pub mod http_impls;
pub mod key;
mod kind;
pub mod panic;
mod progress;
mod resume;
mod state;
pub mod stripes;
pub mod time;
mod tokens;
mod traits;

pub use classify::{Classify, DefaultClassifier, Failure, Outcome};
pub use config::{ConfigError, ConfigProblem};
pub use error::{
    breaks_a_line, printable, ErrorKind, IntoToolError, ToolError, MAX_SOURCE_DEPTH,
    MAX_SOURCE_MESSAGE, MAX_TOOL_NAME_SHOWN,
};
pub use kind::CallKind;
pub use progress::{IdleClock, Progress, ProgressEvent, MAX_PROGRESS_MESSAGE};
pub use resume::{Resume, ResumeFuture, ResumeSink};
pub use state::{own_call, CallState};
pub use tokens::{AttemptGuard, CallTokens};
/// The token type of [`CallTokens`] and `ToolRequest::cancel_token`, re-exported so a
/// caller needs no `tokio-util` dependency of its own (nor keep its version in step).
pub use tokio_util::sync::CancellationToken;
pub use traits::{
    idempotency_key_of, CallIds, CallMeta, Hedged, InBandFailure, ShieldRequest, ShieldResponse,
    SlowCall,
};

/// tower's boxed error, which the generic layers accept from inner services and convert
/// with [`ToolError::from_boxed`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
