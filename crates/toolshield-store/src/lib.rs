#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bounds;
mod counter;
mod error;
mod future;
mod handle;
mod map;
mod service;

pub use bounds::MemoryBounds;
pub use counter::Counter;
pub use error::{StoreError, StoreFuture};
pub use future::{BoxedPath, LayerFuture};
pub use handle::{LayerState, StoreHandle};
pub use map::{Found, TtlMap, Write};
pub use service::{take_ready, StorePath, StoreService};
