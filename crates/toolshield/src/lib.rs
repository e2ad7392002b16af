#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::time::Duration;

use tower::layer::util::Stack;
use tower::ServiceBuilder;

pub use toolshield_breaker as breaker;
pub use toolshield_budget as budget;
pub use toolshield_bulkhead as bulkhead;
pub use toolshield_cache as cache;
pub use toolshield_cancel as cancel;
pub use toolshield_chaos as chaos;
pub use toolshield_core as core;
pub use toolshield_fallback as fallback;
pub use toolshield_hedge as hedge;
pub use toolshield_idempotency as idempotency;
pub use toolshield_metrics as metrics;
pub use toolshield_provenance as provenance;
pub use toolshield_ratelimit as ratelimit;
pub use toolshield_retry as retry;
pub use toolshield_timeout as timeout;
pub use toolshield_validate as validate;

/// The `toolshield` command line (feature `cli`): `toolshield breakers status|open|close|reset`.
#[cfg(feature = "cli")]
pub mod cli;

pub use toolshield_core::{
    CallIds, CallKind, Classify, DefaultClassifier, ErrorKind, IntoToolError, Outcome, Provenance,
    ProvenanceBox, ToolError, ToolRequest, ToolResponse, ToolResult,
};

pub mod collectors;
pub mod config;
mod reload;
mod select;
pub mod shield;

pub use config::{ShieldConfig, ToolConfig};
pub use shield::{BoxTool, ReloadSummary, RouterBuilder, Shield, ToolRouter};

/// The names most programs need.
pub mod prelude {
    pub use crate::{ServiceBuilderExt, Shield, ShieldConfig, ToolRouter};
    pub use toolshield_core::{
        CallKind, CancellationToken, ErrorKind, Provenance, ToolError, ToolRequest, ToolResponse,
        ToolResult, ToolStatus,
    };
}

mod sealed {
    pub trait Sealed {}
    impl<L> Sealed for tower::ServiceBuilder<L> {}
}

/// The toolshield layers that are built from arguments, as methods of
/// [`tower::ServiceBuilder`] (tower's own `timeout(Duration)` is the model). A layer you
/// built already goes in with `.layer(layer)`.
///
/// Sealed: implemented for `ServiceBuilder` only. Where each layer goes: see
/// [the layer order](https://github.com/toolshield/toolshield/blob/main/docs/layer-order.md).
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

    /// Retries with the default backoff and budget, `max_attempts` attempts in all
    /// ([`toolshield_retry::RetryLayer::new`]). (Named so that it does not clash with
    /// tower's own `ServiceBuilder::retry`.)
    fn retries(self, max_attempts: u32) -> ServiceBuilder<Stack<toolshield_retry::RetryLayer, L>>;

    /// Validation of payloads against one tool's schema
    /// ([`toolshield_validate::ValidateLayer`]).
    fn validated(
        self,
        schema: toolshield_validate::Schema,
    ) -> ServiceBuilder<Stack<toolshield_validate::ValidateLayer, L>>;

    /// Per-attempt metrics sharing the handles of a call-metrics layer
    /// ([`toolshield_metrics::MetricsLayer::attempt_layer`]).
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

    fn retries(self, max_attempts: u32) -> ServiceBuilder<Stack<toolshield_retry::RetryLayer, L>> {
        self.layer(toolshield_retry::RetryLayer::new(max_attempts))
    }

    fn validated(
        self,
        schema: toolshield_validate::Schema,
    ) -> ServiceBuilder<Stack<toolshield_validate::ValidateLayer, L>> {
        self.layer(toolshield_validate::ValidateLayer::new(schema))
    }

    fn attempt_metrics(
        self,
        layer: &toolshield_metrics::MetricsLayer,
    ) -> ServiceBuilder<Stack<toolshield_metrics::AttemptMetricsLayer, L>> {
        self.layer(layer.attempt_layer())
    }
}

/// The repository's README, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// `docs/getting-started.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/getting-started.md")]
pub struct GettingStartedDoctests;
