//! Read-only result cache for tool calls.
//!
//! Caches the results of `ReadOnly` calls under `cache:{tool}:-:sha256(canonical payload)`
//! (RFC 8785, so key order and number spelling do not matter), or
//! `cache:{tool}:s<len>:<caller>:<sha256>` when namespaced by caller ([`storage_key`]:
//! injective, so no tool name or caller id reaches another caller's entry). Per-tool TTL, and TTL 0 (the default) means off. A hit returns the stored
//! response with `provenance.cache_hit = true` and its original `fetched_at`.
//!
//! - **Single-flight**: concurrent misses on one key run the tool once and share the
//!   result; if that call is dropped or ends `CANCELLED`, a waiting one takes over (one
//!   caller's cancellation is never another caller's answer).
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
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use serde_json::json;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//! use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
//! use toolshield_cache::{CacheConfig, CacheLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(600)))?;
//! let handle = layer.handle();
//! let mut svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: ToolRequest| async {
//!     Ok::<_, ToolError>(ToolResponse::new(json!({"temp": 21})))
//! }));
//!
//! let req = ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly);
//! let first = svc.ready().await?.call(req.clone()).await?;
//! let second = svc.ready().await?.call(req).await?;
//! assert!(!first.provenance.cache_hit && second.provenance.cache_hit);
//! assert_eq!(first.provenance.fetched_at, second.provenance.fetched_at);
//! assert_eq!((handle.counts().hits, handle.counts().misses), (1, 1));
//! # Ok(())
//! # }
//! ```

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
