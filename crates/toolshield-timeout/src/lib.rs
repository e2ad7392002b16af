#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod future;
mod layer;
mod service;

pub use config::TimeoutConfig;
pub use future::ResponseFuture;
pub use layer::{DeadlineLayer, TimeoutLayer};
pub use service::{Deadline, Timeout};
