#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! [`ProvenanceLayer`] fills in the [`Provenance`](toolshield_core::Provenance) of every
//! response, keeping what the tool or an inner layer already wrote:
//!
//! | field | value |
//! |---|---|
//! | `source` | what the tool set, else the configured source, else the tool name |
//! | `tool` | the tool called |
//! | `fetched_at` | when the data was fetched: a cache hit or an idempotent replay keeps the original time |
//! | `cache_hit`, `replayed`, `stale`, `slow` | as set by the cache, idempotency and timeout layers |
//! | `attempts` | as counted by the retry layer (1 without one) |
//! | `execution_id` | the attempt that produced the data, as [`AttemptProvenanceLayer`] records it below a retry (a retry gives each attempt an id of its own); without that layer, what the tool or an inner layer wrote, else the id the call entered with (its first attempt's) |
//! | `trace_id` | the request's trace id |
//! | `duration` (`durationMs`) | the duration of this logical call, cache hits included |
//! | `response_digest` | SHA-256 of the RFC 8785 canonical output ([`payload_digest`](toolshield_core::payload_digest)) |
//! | `progress_reports`, `progress_message` | how many progress reports the tool made ([`Progress::report`](toolshield_core::Progress::report)), across attempts, and the last message; left out of JSON when there were none |
//!
//! Errors get the attempts made and the elapsed time
//! ([`ToolError::with_attempts`](toolshield_core::ToolError::with_attempts),
//! [`with_elapsed`](toolshield_core::ToolError::with_elapsed)), and the tool and its
//! source ([`with_provenance`](toolshield_core::ToolError::with_provenance), kept when an
//! inner layer set them), so the [`ToolResult`](toolshield_core::ToolResult) envelope
//! shows them.
//!
//! In [the default stack](https://github.com/toolshield/toolshield/blob/main/docs/layer-order.md) the layer sits right inside metrics and outside
//! everything else, so the duration covers the whole call and a cache hit is stamped
//! like a fresh result.

mod attempt;
mod config;
mod future;
mod layer;
mod service;

pub use attempt::{AttemptFuture, AttemptProvenance, AttemptProvenanceLayer};
pub use config::ProvenanceConfig;
pub use future::ResponseFuture;
pub use layer::ProvenanceLayer;
pub use service::Provenance;
