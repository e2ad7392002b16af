#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! Caches the results of `ReadOnly` calls under `cache:{tool}:-:sha256(canonical payload)`
//! (RFC 8785, so key order and number spelling do not matter), or
//! `cache:{tool}:s<len>:<caller>:<sha256>` when namespaced by caller ([`storage_key`]:
//! injective, so no tool name or caller id reaches another caller's entry). Per-tool TTL, and TTL 0 (the default) means off. A hit returns the stored
//! response with `provenance.cache_hit = true` and its original `fetched_at`.
//!
//! - **Single-flight**: concurrent misses on one key run the tool once and share the
//!   result; if that call is dropped, ends `CANCELLED` or reaches its own deadline, a
//!   waiting one takes over (one caller's cancellation is never another caller's answer).
//!   A refusal that may be its caller's own (`RATE_LIMITED`, `OVERLOADED`,
//!   `UNAUTHORIZED`), or the stale entry served for it, reaches only followers of the same
//!   caller; a follower leaves with `TIMEOUT` at its own deadline.
//! - **Errors are never cached** (nor in-band failures such as MCP `isError`).
//! - **Stale-if-error**: within a grace period after the TTL, a call that fails because
//!   the tool is unavailable (timeout, connection, 5xx, open circuit) returns the old
//!   entry marked `stale = true`.
//!
//! In the default stack it sits outside idempotency, fallback, retry and the breaker, so
//! cached data is served even while a circuit is open.
//!
//! Entries live in a [`CacheStore`]: [`InMemoryCacheStore`] here (bounded by entries and
//! bytes), Redis in `toolshield-redis`. Every store passes `testing::contract` (feature
//! `testing`); `testing::FaultyCacheStore` injects store faults for tests.

mod config;
mod flight;
mod future;
mod handle;
mod layer;
mod memory;
mod service;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{CacheConfig, ToolCacheConfig};
pub use future::ResponseFuture;
pub use handle::{CacheCounts, CacheHandle};
pub use layer::CacheLayer;
pub use memory::InMemoryCacheStore;
pub use service::{storage_key, Cache, PerUser};
pub use store::{CacheLookup, CacheStore, StoreError, StoreFuture};
pub use toolshield_store::MemoryBounds;
