//! [`ResponseFuture`] of the idempotency service.

use toolshield_core::ToolResponse;

/// The future of [`Idempotency`](crate::Idempotency): the inner future untouched for
/// calls the layer does not guard, a rejection known at once, or the claim / call /
/// record lifecycle (one boxed future: it awaits the store, which is I/O anyway). The
/// shared [`LayerFuture`](toolshield_store::LayerFuture) of the store-backed layers.
pub type ResponseFuture<F> = toolshield_store::LayerFuture<F, ToolResponse>;
