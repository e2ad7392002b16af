//! [`Error`]: what a Redis operation can fail with, and its conversions.

use std::fmt;
use std::time::Duration;

use toolshield_core::{ErrorKind, ToolError};

/// A Redis operation failed: the server could not be reached, did not answer within the
/// operation timeout, answered with an error, or returned a value that does not parse.
///
/// It converts into the stores' `StoreError` and into a `STORE_UNAVAILABLE` [`ToolError`].
#[derive(Debug, Clone)]
pub struct Error {
    message: String,
    timed_out: bool,
}

impl Error {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            timed_out: false,
        }
    }

    pub(crate) fn timeout(what: &str, after: Duration) -> Self {
        Error {
            message: format!("{what} timed out after {after:?}"),
            timed_out: true,
        }
    }

    pub(crate) fn redis(what: &str, e: &redis::RedisError) -> Self {
        Error::new(format!("{what}: {e}"))
    }

    /// Whether the operation hit its timeout (a slow or paused Redis).
    pub fn is_timeout(&self) -> bool {
        self.timed_out
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis: {}", self.message)
    }
}

impl std::error::Error for Error {}

// The one `StoreError` of both store traits (`toolshield_store::StoreError`).
impl From<Error> for toolshield_cache::StoreError {
    fn from(e: Error) -> Self {
        toolshield_cache::StoreError::new(e.to_string())
    }
}

impl From<Error> for ToolError {
    fn from(e: Error) -> Self {
        ToolError::from_source(ErrorKind::StoreUnavailable, e)
    }
}
