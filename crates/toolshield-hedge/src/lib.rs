#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod budget;
mod config;
mod future;
mod histogram;
mod layer;
mod service;

pub use budget::HedgeBudget;
pub use config::{DelayConfig, HedgeConfig, PercentileDelay, MAX_HEDGES};
pub use future::ResponseFuture;
pub use histogram::{LatencyHistogram, MIN_SAMPLES};
pub use layer::{HedgeDelay, HedgeLayer, HedgeStats};
pub use service::Hedge;
