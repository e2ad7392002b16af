//! The cache store contract: [`CacheStore`], lookups and errors.
//!
//! Every operation is one round trip to a shared store such as Redis:
//!
//! | operation | meaning | Redis |
//! |---|---|---|
//! | [`get`](CacheStore::get) | the entry and the time it has left | `GET key` + `PTTL key`, pipelined (or one Lua script) |
//! | [`put`](CacheStore::put) | write (or overwrite) with a TTL | `SET key json PX ttl` |
//! | [`remove`](CacheStore::remove) | delete | `DEL key` |
//!
//! The store owns expiry: the layer writes an entry with a TTL of *fresh TTL + stale
//! grace* and decides fresh or stale from the time left, so no clock is compared across
//! processes. Entries are [`ToolResponse`]s serialised as JSON (output and provenance;
//! extensions are not kept).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use toolshield_core::{ErrorKind, ToolError, ToolResponse};

/// The future every store operation returns (boxed: stores do I/O, and it keeps the
/// trait object-safe, `Arc<dyn CacheStore>`).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A live entry found by [`CacheStore::get`].
#[derive(Debug, Clone)]
pub struct CacheLookup {
    /// The stored response.
    pub response: ToolResponse,
    /// The time it has left in the store (`PTTL`).
    pub ttl_left: Duration,
}

/// A store could not do what was asked.
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
        write!(f, "cache store: {}", self.message)
    }
}

impl std::error::Error for StoreError {}

impl From<StoreError> for ToolError {
    fn from(e: StoreError) -> Self {
        ToolError::from_source(ErrorKind::StoreUnavailable, e)
    }
}

/// Where cached responses live. Keys are full storage keys
/// ([`storage_key`](crate::storage_key): `cache:{tool}:-:<digest>`,
/// `cache:{tool}:s<len>:<caller>:<digest>`), stored as given.
///
/// Implementations must pass the contract suite in `testing::contract` (feature `testing`).
pub trait CacheStore: Send + Sync + 'static {
    /// The live entry under `key` and its time left, if any.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<CacheLookup>>;

    /// Stores `response` under `key` for `ttl` (replacing any entry). A zero `ttl` stores
    /// nothing.
    fn put<'a>(
        &'a self,
        key: &'a str,
        response: ToolResponse,
        ttl: Duration,
    ) -> StoreFuture<'a, ()>;

    /// Deletes the entry under `key`; `Ok(true)` when a live one was there.
    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool>;
}
