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

use std::time::Duration;

use toolshield_core::ToolResponse;
pub use toolshield_store::{StoreError, StoreFuture};

/// A live entry found by [`CacheStore::get`].
#[derive(Debug, Clone)]
pub struct CacheLookup {
    /// The stored response.
    pub response: ToolResponse,
    /// The time it has left in the store (`PTTL`).
    pub ttl_left: Duration,
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

    /// The live entry under `key` without I/O, when the store can answer at once (an
    /// in-memory store): the layer then answers a fresh hit in `call`, with no future to
    /// box and no clone of the service. `None` when there is no entry, or when the store
    /// cannot answer without I/O (the default): the layer looks the key up through
    /// [`get`](Self::get) as usual. It must answer what `get` would.
    fn lookup_now(&self, key: &str) -> Option<CacheLookup> {
        let _ = key;
        None
    }

    /// Whether [`lookup_now`](Self::lookup_now) answers for every key, a miss included
    /// (an in-memory store): its `None` then means there is no live entry, and the layer
    /// does not ask [`get`](Self::get) again on a miss. `false` by default: a store that
    /// answers some keys at once (a near cache in front of a remote one) is still asked
    /// through `get` when `lookup_now` finds nothing.
    fn answers_now(&self) -> bool {
        false
    }

    /// Stores `response` under `key` for `ttl` without I/O, when the store can (an
    /// in-memory store): the layer then writes a miss's result with no boxed future.
    /// `Err(response)` hands the response back when the store cannot (the default): the
    /// layer writes it through [`put`](Self::put) as usual. It must do what `put` would.
    fn try_put_now(
        &self,
        key: &str,
        response: ToolResponse,
        ttl: Duration,
    ) -> Result<(), ToolResponse> {
        let _ = (key, ttl);
        Err(response)
    }
}
