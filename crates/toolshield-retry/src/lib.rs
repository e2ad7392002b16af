#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! [`RetryLayer`] wraps any `Service<Req>` whose request implements
//! [`ShieldRequest`](toolshield_contract::ShieldRequest) (`toolshield_core::ToolRequest`,
//! `http::Request` and plain values) and whose response implements
//! [`ShieldResponse`](toolshield_contract::ShieldResponse). A failed call is tried again when:
//!
//! - the [classifier](toolshield_contract::Classify) says the failure is retriable (by
//!   default `TIMEOUT`, `RATE_LIMITED`, `CONNECTION_FAILED`, `UPSTREAM_UNAVAILABLE`);
//! - attempts are left (3 in total by default);
//! - the call is not a [`Mutating`](toolshield_contract::CallKind::Mutating) one without an
//!   idempotency key, nor a `Mutating` one whose failure may have taken effect
//!   ([`ErrorKind::may_have_taken_effect`](toolshield_contract::ErrorKind::may_have_taken_effect):
//!   a `TIMEOUT` after it was sent), key or not;
//! - the wait ends before the request's deadline, if it has one;
//! - the [`RetryBudget`] shared by every clone of the layer has a token (retries add at
//!   most 20 % of calls, with a floor of 10 per second).
//!
//! The wait is the error's `retry_after` when it carries one, 30 s for a `RATE_LIMITED`
//! error that does not, and otherwise the [`BackoffStrategy`] (exponential from 500 ms,
//! factor 2, capped at 5 s, full jitter by default). Cancelling the caller's token during
//! the wait ends the call at once with `CANCELLED`. Each attempt polls the inner service
//! ready again and gets a fresh execution id; the number of attempts ends up in the
//! response's provenance and on the error.
//!
//! In the default stack the layer sits inside fallback and outside the circuit breaker and
//! the attempt timeout (the whole order: `docs/layer-order.md`).

mod backoff;
mod budget;
mod config;
mod future;
mod layer;
mod service;
mod shared;

pub use backoff::{Backoff, BackoffStrategy, Jitter};
pub use budget::RetryBudget;
pub use config::{BudgetConfig, RetryConfig};
pub use future::ResponseFuture;
pub use layer::RetryLayer;
pub use service::Retry;
