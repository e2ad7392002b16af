#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod future;
mod layer;
mod policy;
mod service;
mod shared;
mod stats;

pub use future::ResponseFuture;
pub use layer::FallbackLayer;
pub use policy::{default_hand_over, Escalation, FallbackFailure};
pub use service::Fallback;
pub use stats::FallbackStats;
