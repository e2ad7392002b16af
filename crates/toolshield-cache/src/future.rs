//! [`ResponseFuture`] of the cache service.

use toolshield_core::ToolResponse;

/// The future of [`Cache`](crate::Cache): the inner future untouched for calls that are
/// not cached, or the lookup / single-flight path (one boxed future: it awaits the
/// store). The shared [`LayerFuture`](toolshield_store::LayerFuture) of the store-backed
/// layers.
pub type ResponseFuture<F> = toolshield_store::LayerFuture<F, ToolResponse>;
