#![doc = include_str!("../README.md")]

mod bounds;
mod error;
mod future;
mod map;

pub use bounds::MemoryBounds;
pub use error::{StoreError, StoreFuture};
pub use future::{BoxedPath, LayerFuture};
pub use map::{Found, TtlMap, Write};
