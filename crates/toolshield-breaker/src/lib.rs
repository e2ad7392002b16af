#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! [`BreakerLayer`] puts a circuit breaker in front of a service, one breaker per key
//! (the tool name by default, see [`KeyFn`]), all held by a [`BreakerRegistry`] that every
//! clone and every service built from it shares: a tool that keeps failing is cut off for
//! every caller at once.
//!
//! - **Closed**: calls pass; outcomes are classified ([`Classify`](toolshield_contract::Classify))
//!   and recorded. The breaker opens on any of: `consecutive_failures` failures in a row;
//!   a failure rate of at least `failure_rate` % over the window (the last N calls, or the
//!   last T seconds in buckets) once it holds `min_calls`; a slow-call rate of at least
//!   `slow_call_rate` % (calls marked slow by the timeout layer, or slower than
//!   `slow_call_duration`). Cancellations and client errors never count.
//! - **Open**: calls fail fast with `CIRCUIT_OPEN` from `call` (never `poll_ready`),
//!   carrying the time left as `retry_after`.
//! - **Half-open**: after `open_wait` (optionally growing on repeated opens, capped), at
//!   most `half_open_permits` probes run at once; `half_open_successes` successes close the
//!   breaker, any probe failure re-opens it, a dropped probe frees its permit.
//! - **Manual**: [`force_open`](BreakerRegistry::force_open),
//!   [`force_closed`](BreakerRegistry::force_closed) (disabled, still recording),
//!   [`metrics_only`](BreakerRegistry::metrics_only) (shadow mode: reports, never rejects),
//!   [`reset`](BreakerRegistry::reset), per key or all; [`status`](BreakerRegistry::status).
//! - **Events**: every transition and override is a `tracing` event, goes to
//!   [`subscribe`](BreakerRegistry::subscribe)rs and [`on_event`](BreakerRegistry::on_event)
//!   callbacks, and can be appended to a JSON-lines file.
//!
//! The closed-state admit and record are a few atomic loads (and, while failures are in
//! the window, a few atomic writes): no lock, no allocation, no clock read with a count
//! window. The response future holds a reference on its breaker; each thread keeps the
//! one its last finished call held, and its next call on that breaker takes it, so a
//! thread calling one breaker again and again writes no reference count either. That
//! reference lives until the thread finishes a call on another breaker, or exits; a
//! breaker the registry no longer holds is never kept.
//!
//! In the default stack the breaker sits inside retry and outside the attempt timeout, so
//! it checks and records every attempt, and sees the timeout layer's slow-call marks.

mod config;
mod event_log;
mod events;
mod future;
mod key;
mod layer;
#[cfg(all(test, toolshield_loom))]
mod loom_model;
mod registry;
mod service;
mod shared;
mod state;

pub use config::{BreakerConfig, WindowConfig};
pub use events::{BreakerEvent, CircuitState, EvictedCounts, TransitionCount, TransitionReason};
pub use future::ResponseFuture;
pub use key::{key_fn, FixedKey, FnKey, KeyFn, ToolKey, UNNAMED_KEY};
pub use layer::{BreakerLayer, PinnedBreakerLayer};
pub use registry::{BreakerRegistry, MAX_KEY_LEN};
pub use service::Breaker;
pub use shared::SharedOpenState;
pub use state::BreakerStatus;
