#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod gcra;
mod layer;
mod service;
mod store;

pub use config::{OnLimit, OnStoreError, RateKey, RateLimitConfig};
pub use gcra::{Decision, RateLimit, Turn};
pub use layer::{ConfiguredKey, RateLimitLayer, RateLimitSnapshot, RateLimitStats};
pub use service::RateLimiter;
pub use store::{MemoryRateLimitStore, RateLimitStore};
pub use toolshield_contract::key::{key_fn, ByCaller, ByName, ByRun, FnKey, KeyFn};
/// What a [`RateLimitStore`] operation returns (from `toolshield-store`, shared by every store).
pub use toolshield_store::{StoreError, StoreFuture};
