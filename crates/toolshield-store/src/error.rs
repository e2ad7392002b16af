//! [`StoreError`] and [`StoreFuture`]: what every store operation returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use toolshield_contract::{ErrorKind, ToolError};

/// The future every store operation returns.
///
/// Boxed: stores do I/O, so one allocation per operation is invisible next to a network
/// round trip, and it keeps the store traits object-safe (`Arc<dyn CacheStore>`,
/// `Arc<dyn IdempotencyStore>`). An in-memory store answers with a ready one.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A store could not do what was asked (connection lost, timeout, a record that does not
/// parse or does not fit). It converts into a `STORE_UNAVAILABLE` [`ToolError`].
///
/// ```
/// use toolshield_contract::{ErrorKind, ToolError};
/// use toolshield_store::StoreError;
///
/// let e = StoreError::new("connection refused");
/// assert_eq!(e.to_string(), "store: connection refused");
/// assert_eq!(ToolError::from(e).kind(), ErrorKind::StoreUnavailable);
/// ```
#[derive(Debug, Clone)]
pub struct StoreError {
    message: String,
}

impl StoreError {
    /// A store error with a short lowercase message.
    pub fn new(message: impl Into<String>) -> Self {
        StoreError {
            message: message.into(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store: {}", self.message)
    }
}

impl std::error::Error for StoreError {}

impl From<StoreError> for ToolError {
    fn from(e: StoreError) -> Self {
        ToolError::from_source(ErrorKind::StoreUnavailable, e)
    }
}
