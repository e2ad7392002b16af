#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod future;
mod gate;
mod layer;
mod service;

pub use config::{BulkheadConfig, BulkheadKey, MAX_CONCURRENT, MAX_QUEUE};
pub use future::ResponseFuture;
pub use layer::{BulkheadLayer, BulkheadSnapshot, BulkheadStats, ConfiguredKey, Whole};
pub use service::Bulkhead;
pub use toolshield_contract::key::{key_fn, ByCaller, ByName, ByRun, FnKey, KeyFn};
