#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! ## In detail
//!
//! A `Mutating` or `Idempotent` call carries an idempotency key (given, or derived as
//! sha256(tool, canonical payload, caller, 1 h window)). The first call with a key
//! *claims* it as PENDING with a lease (renewed while the call runs) and runs the tool;
//! its outcome is recorded:
//!
//! | outcome | record | a duplicate gets |
//! |---|---|---|
//! | success | COMPLETED (24 h) | the same response, `provenance.replayed = true`, original `fetched_at` |
//! | non-retriable failure | FAILED (60 s) | the same error |
//! | retriable failure, cancellation | released | a fresh run |
//! | a mutation that timed out after it was sent | FAILED `OUTCOME_UNKNOWN` (24 h) | `OUTCOME_UNKNOWN` until [`IdempotencyHandle::forget`] |
//! | a mutation dropped or timed out before any attempt reached the tool, in a stack that marks its attempts ([`IdempotencyLayer::with_attempt_marks`]) | released | a fresh run |
//!
//! A duplicate that arrives while the first call is PENDING waits for its result (up to
//! 10 s) or fails fast with `IN_PROGRESS`; the same key with another payload is
//! `IDEMPOTENCY_KEY_REUSED` and nothing runs; a claim whose owner died is taken over
//! when its lease expires. The service inside finds a `Resume` handle on the call state of
//! a call the layer claimed: a resume token it records there (an MCP task id) is written
//! to the claim, and an owner that takes the claim over is given it, to pick the work up
//! instead of starting it again. When the store is unreachable the layer fails closed
//! (`STORE_UNAVAILABLE`) or open (runs without dedupe), by config. `ReadOnly` calls pass
//! through untouched.
//!
//! In the default stack it sits inside the cache and outside fallback and retry, so a
//! retried mutation keeps one claim.
//!
//! Records live in an [`IdempotencyStore`]: [`InMemoryIdempotencyStore`] here (bounded,
//! per-record TTL), Redis in `toolshield-redis`. Every store passes the contract suite in
//! `testing::contract` (feature `testing`).

mod config;
mod future;
mod handle;
mod key;
mod layer;
mod memory;
mod service;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{IdempotencyConfig, OnPending, OnStoreError};
pub use future::ResponseFuture;
pub use handle::{IdempotencyCounts, IdempotencyHandle};
pub use key::{derive_key, storage_key, MAX_CALLER_LEN, MAX_KEY_LEN};
pub use layer::IdempotencyLayer;
pub use memory::{record_weight, InMemoryIdempotencyStore};
pub use service::Idempotency;
pub use store::{
    check_resume_token, ClaimOutcome, IdempotencyRecord, IdempotencyStore, PendingClaim,
    RecordStatus, StoreError, StoreFuture, StoredError, MAX_RESUME_TOKEN_LEN,
};
pub use toolshield_store::MemoryBounds;
