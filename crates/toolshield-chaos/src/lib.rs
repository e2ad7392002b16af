#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod future;
mod layer;
mod plan;
mod service;
mod stats;

pub use config::{ChaosConfig, ErrorFault, HangFault, InBandFault, LatencyFault};
pub use future::ResponseFuture;
pub use layer::ChaosLayer;
pub use plan::Fault;
pub use service::Chaos;
pub use stats::{ChaosStats, FaultKind};
