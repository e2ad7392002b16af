#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod canonical;
mod envelope;
#[cfg(feature = "testing")]
pub mod faults;
pub mod keys;
mod request;
mod response;
mod service;
pub mod size;

// The contract the generic layers share, re-exported whole: `toolshield_core::ToolError`
// and `toolshield_contract::ToolError` are one type.
pub use toolshield_contract::*;
pub use toolshield_contract::{config, hash, http_impls, panic, time};

pub use canonical::{cache_key, payload_digest, Digest, DigestHex};
pub use envelope::{ToolResult, ToolResultError, ToolStatus, MAX_ENVELOPE_MESSAGE};
pub use request::{RequestMeta, SharedPayload, ToolRequest};
pub use response::{utc_at, Provenance, ProvenanceBox, ToolResponse};
pub use service::ToolService;
