#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::CancelLayer;
pub use service::Cancel;
