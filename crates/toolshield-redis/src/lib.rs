#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! One process keeps everything in memory. Several replicas point at one Redis (or Redis
//! Cluster) and share:
//!
//! - **idempotency records** ([`RedisIdempotencyStore`]): a mutating call runs once across
//!   every process; duplicates replay its result, wait for it, or get `IN_PROGRESS`;
//! - **cache entries** ([`RedisCacheStore`]): a read-only result fetched by one replica is
//!   a hit for the others;
//! - **breaker open-state** ([`SharedBreakerState`]): when a breaker opens in one process,
//!   the others reject the key with `CIRCUIT_OPEN` for the same open period.
//!
//! Every store operation is **one round trip** (a first execution costs two: claim and
//! finish; a replay one), bounded by a per-operation timeout
//! ([`RedisConfig::op_timeout`], 250 ms by default). A Redis that is down, slow or paused
//! gives a store error that the layers handle as configured: the idempotency layer fails
//! closed (`STORE_UNAVAILABLE`) or open (runs without dedupe, logged), the cache layer
//! treats it as a miss. The connection ([`RedisConnection`]) reconnects by itself: after a
//! Redis restart the same stack works again.
//!
//! A Redis Cluster is configured by its seed nodes ([`RedisConfig::cluster`], or
//! `cluster_nodes` in the serde configuration); the same [`RedisConnection`] then routes
//! every operation to the master of its slot and follows `MOVED`/`ASK` and failovers.
//! Keys carry a hash tag on the tool name, so every script touches one slot:
//!
//! | key | value | TTL |
//! |---|---|---|
//! | `idemp:{tool}:-:g:key` (`s<len>:<caller>` for a caller, `d:` for a derived key) | the idempotency record as JSON | the lease while PENDING, then the record TTL |
//! | `lease:<record key>` | the owner token and payload digest of a claim (tells a takeover, holds the key for its payload) | twice the lease |
//! | `cache:{tool}:-:digest` (`s<len>:<caller>` for a caller) | `{output, provenance}` JSON | entry TTL + stale grace |
//! | `breaker:{registry}` (hash) | per breaker key: open-until (server clock, ms) and origin | the longest open period |
//!
//! `docs/redis.md` describes the scripts, the waiting strategy and the failure handling.

mod breaker;
mod budget;
mod cache;
mod config;
mod connection;
mod error;
mod idempotency;
mod ratelimit;
#[cfg(feature = "testing")]
pub mod testing;

pub use breaker::SharedBreakerState;
pub use budget::{budget_key, RedisBudgetStore};
pub use cache::RedisCacheStore;
pub use config::RedisConfig;
pub use connection::{ConnectError, RedisConnection};
pub use error::Error;
pub use idempotency::RedisIdempotencyStore;
pub use ratelimit::RedisRateLimitStore;
