//! toolshield: reliable tool calls for AI agents, as `tower` middleware.
//!
//! Each concern is its own layer in its own crate; this facade re-exports them and adds
//! [`ServiceBuilderExt`], one method per layer, for composing a stack by hand in the
//! default order (outermost first):
//!
//! ```text
//! metrics + tracing > provenance > cancel > total deadline > validate > cache
//!   > idempotency > fallback > retry > breaker > attempt timeout > the tool
//! ```
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use serde_json::json;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use toolshield::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let weather = service_fn(|req: ToolRequest| async move {
//!     Ok::<_, ToolError>(ToolResponse::new(json!({"city": req.payload()["city"], "temp": 21})))
//! });
//! let svc = ServiceBuilder::new()
//!     .cancellable()
//!     .total_deadline(Duration::from_secs(10))
//!     .attempt_timeout(Duration::from_secs(4), Some(Duration::from_secs(2)))
//!     .service(weather);
//! let req = ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly);
//! let result: ToolResult = svc.oneshot(req).await.into();
//! assert!(result.is_success());
//! # }
//! ```

use std::time::Duration;

use tower::layer::util::Stack;
use tower::ServiceBuilder;

pub use toolshield_breaker as breaker;
pub use toolshield_cache as cache;
pub use toolshield_cancel as cancel;
pub use toolshield_core as core;
pub use toolshield_fallback as fallback;
pub use toolshield_idempotency as idempotency;
pub use toolshield_metrics as metrics;
pub use toolshield_provenance as provenance;
pub use toolshield_retry as retry;
pub use toolshield_timeout as timeout;
pub use toolshield_validate as validate;

/// The `toolshield` command line (feature `cli`): `toolshield breakers status|open|close|reset`.
#[cfg(feature = "cli")]
pub mod cli;

pub use toolshield_core::{
    CallKind, Classify, DefaultClassifier, ErrorKind, Outcome, Provenance, ToolError, ToolRequest,
    ToolResponse, ToolResult,
};

pub mod config;
pub mod shield;

pub use config::{ShieldConfig, ToolConfig};
pub use shield::{BoxTool, RouterBuilder, Shield, ToolRouter};

/// The names most programs need.
pub mod prelude {
    pub use crate::{ServiceBuilderExt, Shield, ShieldConfig, ToolRouter};
    pub use toolshield_core::{
        CallKind, ErrorKind, Provenance, ToolError, ToolRequest, ToolResponse, ToolResult,
    };
}

mod sealed {
    pub trait Sealed {}
    impl<L> Sealed for tower::ServiceBuilder<L> {}
}

/// One method per toolshield layer on [`tower::ServiceBuilder`].
///
/// Sealed: implemented for `ServiceBuilder` only. Call the methods in the default order
/// (outermost first) unless you have a reason not to; `docs/layer-order.md` explains it.
pub trait ServiceBuilderExt<L>: sealed::Sealed {
    /// Checks the call token before the call and races it against the call
    /// ([`toolshield_cancel::CancelLayer`]).
    fn cancellable(self) -> ServiceBuilder<Stack<toolshield_cancel::CancelLayer, L>>;

    /// A deadline for the whole call, visible to the layers inside
    /// ([`toolshield_timeout::DeadlineLayer`]). A `total` longer than
    /// [`MAX_DURATION`](toolshield_core::config::MAX_DURATION) is clamped to it.
    fn total_deadline(
        self,
        total: Duration,
    ) -> ServiceBuilder<Stack<toolshield_timeout::DeadlineLayer, L>>;

    /// A hard timeout per attempt and an optional soft (slow-call) threshold
    /// ([`toolshield_timeout::TimeoutLayer`]), each clamped to
    /// [`MAX_DURATION`](toolshield_core::config::MAX_DURATION).
    fn attempt_timeout(
        self,
        attempt: Duration,
        soft: Option<Duration>,
    ) -> ServiceBuilder<Stack<toolshield_timeout::TimeoutLayer, L>>;
    /// Retries with backoff, deadline-aware ([`toolshield_retry::RetryLayer`]).
    /// (Named so that it does not clash with tower's own `ServiceBuilder::retry`.)
    fn retries<P>(
        self,
        layer: toolshield_retry::RetryLayer<P>,
    ) -> ServiceBuilder<Stack<toolshield_retry::RetryLayer<P>, L>>;

    /// Per-key circuit breakers ([`toolshield_breaker::BreakerLayer`]).
    fn circuit_breaker<K, C>(
        self,
        layer: toolshield_breaker::BreakerLayer<K, C>,
    ) -> ServiceBuilder<Stack<toolshield_breaker::BreakerLayer<K, C>, L>>;

    /// The read-only result cache ([`toolshield_cache::CacheLayer`]).
    fn result_cache(
        self,
        layer: toolshield_cache::CacheLayer,
    ) -> ServiceBuilder<Stack<toolshield_cache::CacheLayer, L>>;

    /// Deduplication of mutating calls ([`toolshield_idempotency::IdempotencyLayer`]).
    fn idempotent_mutations(
        self,
        layer: toolshield_idempotency::IdempotencyLayer,
    ) -> ServiceBuilder<Stack<toolshield_idempotency::IdempotencyLayer, L>>;

    /// JSON Schema validation of payloads ([`toolshield_validate::ValidateLayer`]).
    fn validated(
        self,
        schemas: toolshield_validate::Schemas,
    ) -> ServiceBuilder<Stack<toolshield_validate::ValidateLayer, L>>;

    /// An ordered fallback chain ([`toolshield_fallback::FallbackLayer`]).
    fn fallback_tiers(
        self,
        layer: toolshield_fallback::FallbackLayer,
    ) -> ServiceBuilder<Stack<toolshield_fallback::FallbackLayer, L>>;

    /// Provenance on every result ([`toolshield_provenance::ProvenanceLayer`]).
    fn provenance(
        self,
        layer: toolshield_provenance::ProvenanceLayer,
    ) -> ServiceBuilder<Stack<toolshield_provenance::ProvenanceLayer, L>>;

    /// Metrics and the `tool_execution` span, once per logical call
    /// ([`toolshield_metrics::MetricsLayer`]); place it outermost.
    fn call_metrics(
        self,
        layer: toolshield_metrics::MetricsLayer,
    ) -> ServiceBuilder<Stack<toolshield_metrics::MetricsLayer, L>>;

    /// Metrics and the `tool_attempt` span, once per attempt
    /// ([`toolshield_metrics::AttemptMetricsLayer`]); place it inside retry.
    fn attempt_metrics(
        self,
        layer: &toolshield_metrics::MetricsLayer,
    ) -> ServiceBuilder<Stack<toolshield_metrics::AttemptMetricsLayer, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn cancellable(self) -> ServiceBuilder<Stack<toolshield_cancel::CancelLayer, L>> {
        self.layer(toolshield_cancel::CancelLayer::new())
    }

    fn total_deadline(
        self,
        total: Duration,
    ) -> ServiceBuilder<Stack<toolshield_timeout::DeadlineLayer, L>> {
        self.layer(toolshield_timeout::DeadlineLayer::new(total))
    }

    fn attempt_timeout(
        self,
        attempt: Duration,
        soft: Option<Duration>,
    ) -> ServiceBuilder<Stack<toolshield_timeout::TimeoutLayer, L>> {
        let mut layer = toolshield_timeout::TimeoutLayer::new(attempt);
        if let Some(soft) = soft {
            layer = layer.soft_threshold(soft);
        }
        self.layer(layer)
    }
    fn retries<P>(
        self,
        layer: toolshield_retry::RetryLayer<P>,
    ) -> ServiceBuilder<Stack<toolshield_retry::RetryLayer<P>, L>> {
        self.layer(layer)
    }

    fn circuit_breaker<K, C>(
        self,
        layer: toolshield_breaker::BreakerLayer<K, C>,
    ) -> ServiceBuilder<Stack<toolshield_breaker::BreakerLayer<K, C>, L>> {
        self.layer(layer)
    }

    fn result_cache(
        self,
        layer: toolshield_cache::CacheLayer,
    ) -> ServiceBuilder<Stack<toolshield_cache::CacheLayer, L>> {
        self.layer(layer)
    }

    fn idempotent_mutations(
        self,
        layer: toolshield_idempotency::IdempotencyLayer,
    ) -> ServiceBuilder<Stack<toolshield_idempotency::IdempotencyLayer, L>> {
        self.layer(layer)
    }

    fn validated(
        self,
        schemas: toolshield_validate::Schemas,
    ) -> ServiceBuilder<Stack<toolshield_validate::ValidateLayer, L>> {
        self.layer(toolshield_validate::ValidateLayer::new(schemas))
    }

    fn fallback_tiers(
        self,
        layer: toolshield_fallback::FallbackLayer,
    ) -> ServiceBuilder<Stack<toolshield_fallback::FallbackLayer, L>> {
        self.layer(layer)
    }

    fn provenance(
        self,
        layer: toolshield_provenance::ProvenanceLayer,
    ) -> ServiceBuilder<Stack<toolshield_provenance::ProvenanceLayer, L>> {
        self.layer(layer)
    }

    fn call_metrics(
        self,
        layer: toolshield_metrics::MetricsLayer,
    ) -> ServiceBuilder<Stack<toolshield_metrics::MetricsLayer, L>> {
        self.layer(layer)
    }

    fn attempt_metrics(
        self,
        layer: &toolshield_metrics::MetricsLayer,
    ) -> ServiceBuilder<Stack<toolshield_metrics::AttemptMetricsLayer, L>> {
        self.layer(layer.attempt_layer())
    }
}
