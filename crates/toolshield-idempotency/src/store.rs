//! The idempotency store contract: records, the [`IdempotencyStore`] trait and its errors.
//!
//! Every operation on the call path is designed to be **one round trip** to a shared store
//! such as Redis (`remove`, an operator's `forget`, takes two):
//!
//! | operation | meaning | Redis |
//! |---|---|---|
//! | [`claim`](IdempotencyStore::claim) | create a PENDING record if absent, else return the existing one | `SET key json NX PX lease GET` (Redis >= 7.0; a Lua script before) |
//! | [`finish`](IdempotencyStore::finish) | owner-checked replace of PENDING by the COMPLETED or FAILED record | Lua: owner check, then `SET key json PX ttl` |
//! | [`renew`](IdempotencyStore::renew) | owner-checked lease extension | Lua: owner check, then `SET key json PX lease` |
//! | [`release`](IdempotencyStore::release) | owner-checked delete | Lua: owner check, then `DEL key` |
//! | [`mark_resume`](IdempotencyStore::mark_resume) | owner-checked write of a resume token into the PENDING record, renewing its lease | Lua: owner check, then `SET key json' PX lease` and the token on the lease marker |
//! | [`get`](IdempotencyStore::get) | read | `GET key` |
//! | [`remove`](IdempotencyStore::remove) | delete whatever the state (`forget`) | `GET key`, then Lua: `DEL key` if it still holds what was read (a resend never deletes a newer claim) |
//!
//! The *owner check* (fencing) passes only when the stored record is `PENDING` **and** its
//! `owner` equals the caller's owner token: a call whose lease expired and was taken over
//! can no longer overwrite the new owner's record, and a finished record is never released.
//! The token is unique to each claim (not to the request: clones of one request carry the
//! same execution id, and each claim must still be told apart).
//!
//! Expiry belongs to the store: a PENDING record lives for its lease (the store's TTL *is*
//! the lease, so an expired lease simply disappears and the next `claim` takes it over), a
//! COMPLETED or FAILED record for the TTL given to `finish`. The wall-clock
//! `lease_until` and `expires_at` inside the record are informational (reconciliation,
//! admin views); no decision is made on them.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use toolshield_core::{Digest, ErrorKind, SharedPayload, ToolError, ToolResponse};
pub use toolshield_store::{StoreError, StoreFuture};

/// The lifecycle state of an idempotency record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RecordStatus {
    /// A call holds the key and is running.
    Pending,
    /// The call succeeded; `result` holds its response.
    Completed,
    /// The call failed in a way that is replayed for a while; `error` holds the error.
    Failed,
}

/// An error as stored in a FAILED record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredError {
    /// The canonical kind.
    pub kind: ErrorKind,
    /// The message.
    pub message: String,
    /// The wait the tool asked for, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl StoredError {
    /// Captures a [`ToolError`] (its source is not kept: it is not serialisable).
    pub fn from_error(error: &ToolError) -> Self {
        StoredError {
            kind: error.kind(),
            message: error.message().to_owned(),
            retry_after_ms: error
                .retry_after()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// Rebuilds the [`ToolError`].
    pub fn to_error(&self) -> ToolError {
        let e = ToolError::new(self.kind, self.message.clone());
        match self.retry_after_ms {
            Some(ms) => e.with_retry_after(Duration::from_millis(ms)),
            None => e,
        }
    }
}

/// One idempotency record, serialised as JSON so a shared store can keep it as a string.
///
/// ```
/// use toolshield_core::Digest;
/// use toolshield_idempotency::{IdempotencyRecord, RecordStatus};
///
/// let rec = IdempotencyRecord::pending(Digest::of_bytes(b"{}"), "exec-1", std::time::Duration::from_secs(30));
/// assert_eq!(rec.status, RecordStatus::Pending);
/// let json = serde_json::to_string(&rec).unwrap();
/// assert!(json.contains("\"status\":\"PENDING\""));
/// assert_eq!(serde_json::from_str::<IdempotencyRecord>(&json).unwrap(), rec);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IdempotencyRecord {
    /// The lifecycle state.
    pub status: RecordStatus,
    /// SHA-256 of the canonical payload the key was first used with.
    pub payload_hash: Digest,
    /// The response of a COMPLETED call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolResponse>,
    /// The error of a FAILED call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StoredError>,
    /// The owner token of the claim (the fencing token): unique to each claim (a random
    /// per-process prefix and a counter), so two clones of one request never own the same
    /// claim.
    pub owner: String,
    /// When the lease of a PENDING record ends (wall clock, informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<DateTime<Utc>>,
    /// When the record expires (wall clock, informational; the store's TTL decides).
    pub expires_at: DateTime<Utc>,
    /// The resume token of a PENDING record: an opaque marker the running call recorded
    /// ([`IdempotencyStore::mark_resume`]) so that an owner taking the claim over can pick
    /// the work up where it is (an MCP adapter records the id of the task the server
    /// created) instead of starting it again. At most [`MAX_RESUME_TOKEN_LEN`] bytes, no
    /// control characters ([`check_resume_token`]). Absent from the JSON when `None`, so
    /// records written before the field existed still read. Kept last: the Redis store
    /// appends it to the record's JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
    /// The payload of the call, shared with its request, in memory only (never
    /// serialized): an in-memory store keeps it with a finished record, so a replay whose
    /// payload is equal as a JSON value needs no digest. `None` in a record read from a
    /// remote store; the digest decides then.
    #[serde(skip)]
    pub payload: Option<SharedPayload>,
}

/// The longest resume token a store accepts, in bytes
/// ([`IdempotencyStore::mark_resume`]).
pub const MAX_RESUME_TOKEN_LEN: usize = 256;

/// Whether `token` may be stored as a resume token: not empty, at most
/// [`MAX_RESUME_TOKEN_LEN`] bytes, and no control characters. A token comes from a remote
/// server (an MCP task id) and ends up in the store and in logs: it must not grow a
/// record, nor carry line breaks or terminal escapes.
///
/// ```
/// use toolshield_idempotency::{check_resume_token, MAX_RESUME_TOKEN_LEN};
///
/// assert!(check_resume_token("task-42").is_ok());
/// assert!(check_resume_token("").is_err());
/// assert!(check_resume_token("a\nb").is_err());
/// assert!(check_resume_token(&"x".repeat(MAX_RESUME_TOKEN_LEN + 1)).is_err());
/// ```
pub fn check_resume_token(token: &str) -> Result<(), StoreError> {
    if token.is_empty() {
        return Err(StoreError::new("an empty resume token is not stored"));
    }
    if token.len() > MAX_RESUME_TOKEN_LEN {
        return Err(StoreError::new(format!(
            "a resume token of {} bytes is longer than {MAX_RESUME_TOKEN_LEN}",
            token.len()
        )));
    }
    if token.chars().any(char::is_control) {
        return Err(StoreError::new(
            "a resume token with control characters is not stored",
        ));
    }
    Ok(())
}

fn wall_after(d: Duration) -> DateTime<Utc> {
    let now = Utc::now();
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl IdempotencyRecord {
    /// A PENDING record owned by `owner`, with a lease of `lease`.
    pub fn pending(payload_hash: Digest, owner: impl Into<String>, lease: Duration) -> Self {
        let until = wall_after(lease);
        IdempotencyRecord {
            status: RecordStatus::Pending,
            payload_hash,
            result: None,
            error: None,
            owner: owner.into(),
            lease_until: Some(until),
            expires_at: until,
            resume: None,
            payload: None,
        }
    }

    /// A COMPLETED record holding `response`, kept for `ttl`.
    pub fn completed(
        payload_hash: Digest,
        owner: impl Into<String>,
        response: ToolResponse,
        ttl: Duration,
    ) -> Self {
        IdempotencyRecord {
            status: RecordStatus::Completed,
            payload_hash,
            result: Some(response),
            error: None,
            owner: owner.into(),
            lease_until: None,
            expires_at: wall_after(ttl),
            resume: None,
            payload: None,
        }
    }

    /// A FAILED record holding `error`, kept for `ttl`.
    pub fn failed(
        payload_hash: Digest,
        owner: impl Into<String>,
        error: &ToolError,
        ttl: Duration,
    ) -> Self {
        IdempotencyRecord {
            status: RecordStatus::Failed,
            payload_hash,
            result: None,
            error: Some(StoredError::from_error(error)),
            owner: owner.into(),
            lease_until: None,
            expires_at: wall_after(ttl),
            resume: None,
            payload: None,
        }
    }

    /// The same record with its lease (and informational times) moved to `lease` from now.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        let until = wall_after(lease);
        self.lease_until = Some(until);
        self.expires_at = until;
        self
    }

    /// Whether the record is an outcome (COMPLETED or FAILED), the kind
    /// [`IdempotencyStore::finish`] takes.
    pub fn is_finished(&self) -> bool {
        self.status != RecordStatus::Pending
    }

    /// Whether the owner check passes for `owner`: the record is PENDING and owned by it.
    pub fn is_owned_by(&self, owner: &str) -> bool {
        self.status == RecordStatus::Pending && self.owner == owner
    }
}

/// What [`IdempotencyStore::claim`] found.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // returned once per claim, next to a store round trip
pub enum ClaimOutcome {
    /// The key was free: the PENDING record was written and the caller owns it.
    Claimed,
    /// The key was held by a PENDING claim whose lease had expired without an outcome
    /// (its owner died, hung or lost the store): the PENDING record was written and the
    /// caller owns it now. The layer counts and logs it as a takeover. Stores report it
    /// when the expired claim is at most one more lease old; after that a claim is
    /// [`Claimed`](Self::Claimed).
    TakenOver {
        /// The resume token the expired claim carried ([`IdempotencyStore::mark_resume`]),
        /// if any. The store also carries it into the new PENDING record, so a second
        /// takeover (the new owner died too) still finds it.
        resume: Option<String>,
    },
    /// The key is held: the record that is there (PENDING with a live lease, COMPLETED or
    /// FAILED). Nothing was written. Shared: an in-memory store hands out the record it
    /// holds, so a replay copies a pointer rather than the record.
    Existing(Arc<IdempotencyRecord>),
}

/// The parts of a PENDING record, for [`IdempotencyStore::claim_pending`]: the store
/// builds the record ([`record`](Self::record)) only when it writes it, so a claim that
/// finds the key held (a replay) builds nothing.
///
/// ```
/// use std::time::Duration;
/// use toolshield_core::Digest;
/// use toolshield_idempotency::{PendingClaim, RecordStatus};
///
/// let claim = PendingClaim { payload_hash: Digest::of_bytes(b"{}"), owner: "owner-1" };
/// let rec = claim.record(Duration::from_secs(30));
/// assert_eq!((rec.status, rec.owner.as_str()), (RecordStatus::Pending, "owner-1"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingClaim<'a> {
    /// SHA-256 of the canonical payload.
    pub payload_hash: Digest,
    /// The owner token of the claim.
    pub owner: &'a str,
}

impl PendingClaim<'_> {
    /// The PENDING record, with a lease of `lease` from now.
    pub fn record(&self, lease: Duration) -> IdempotencyRecord {
        IdempotencyRecord::pending(self.payload_hash, self.owner, lease)
    }
}

/// Where idempotency records live.
///
/// Keys are full storage keys (`idemp:{tool}:key`, see [`storage_key`](crate::storage_key)).
/// Implementations must make each operation atomic with respect to the others on the same
/// key (a Redis command or script is; the in-memory store uses a per-key lock), and must
/// pass the contract suite in `testing::contract` (feature `testing`).
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Creates `record` (PENDING) under `key` with a TTL of `lease` if no live record is
    /// there; else returns the live record untouched. Reports
    /// [`TakenOver`](ClaimOutcome::TakenOver) when the key was free because an earlier
    /// claim's lease expired without an outcome, with the resume token that claim carried
    /// (which the new PENDING record then carries too, unless `record` has its own). The
    /// key belongs to the expired claim's payload (its owner may have run the call, and a
    /// resume token names work started for it): while it can still be taken over, a claim
    /// with another payload digest finds the key held ([`Existing`](ClaimOutcome::Existing),
    /// with that digest; the layer answers `IDEMPOTENCY_KEY_REUSED`) and nothing is written.
    fn claim<'a>(
        &'a self,
        key: &'a str,
        record: IdempotencyRecord,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome>;

    /// [`claim`](Self::claim) with the PENDING record given by its parts: the record is
    /// built only if it is written. The layer claims through this method; the default
    /// builds the record and calls `claim` (a store that sends the record anyway, Redis,
    /// keeps it), an in-memory store overrides it so a replay builds nothing.
    fn claim_pending<'a>(
        &'a self,
        key: &'a str,
        claim: PendingClaim<'a>,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        self.claim(key, claim.record(lease), lease)
    }

    /// The longest one operation of this store may take before it fails (its own
    /// timeout), or `None` when the store does not bound it (the default; an in-memory
    /// store answers at once). The layer refuses a lease that is not longer
    /// ([`IdempotencyLayer::with_store`](crate::IdempotencyLayer::with_store)): a claim
    /// or a renewal that may take the whole lease could let another call take the key
    /// over while the first still runs.
    fn op_timeout(&self) -> Option<Duration> {
        None
    }

    /// The finished record (COMPLETED or FAILED) under `key`, without I/O, when the store
    /// can answer at once (an in-memory store): the layer then answers a replay in `call`,
    /// with no future to box and no claim. `None` when there is no finished record, or
    /// when the store cannot answer without I/O (the default): the layer claims as usual.
    /// A finished record never changes until it expires or is removed, so answering from
    /// it is what a claim would have answered.
    fn finished_now(&self, key: &str) -> Option<Arc<IdempotencyRecord>> {
        let _ = key;
        None
    }

    /// Replaces the PENDING record owned by `owner` with `record`, COMPLETED or FAILED (its
    /// status says which), kept for `ttl`. `Ok(false)` when the owner check fails (nothing
    /// written). A PENDING `record` is a [`StoreError`] (nothing written).
    fn finish<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool>;

    /// Extends the lease of the PENDING record owned by `owner` to `lease` from now.
    /// `Ok(false)` when the owner check fails (the lease was lost).
    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, bool>;

    /// Writes the resume token `token` into the PENDING record owned by `owner`, replacing
    /// any earlier one, and renews its lease to `lease` from now (as
    /// [`renew`](Self::renew) does: the owner is alive). If the lease then expires, the
    /// next claim within one more lease reports [`TakenOver`](ClaimOutcome::TakenOver)
    /// with the token. `Ok(false)` when the owner check fails (nothing written); a token
    /// that [`check_resume_token`] refuses is a [`StoreError`] (nothing written).
    ///
    /// The default refuses every token with a [`StoreError`]: a store that does not
    /// implement it simply never resumes (a takeover runs the call again).
    fn mark_resume<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, bool> {
        let _ = (key, owner, token, lease);
        Box::pin(std::future::ready(Err(StoreError::new(
            "this idempotency store does not keep resume tokens",
        ))))
    }

    /// Deletes the PENDING record owned by `owner`, so the key can be claimed again.
    /// `Ok(false)` when the owner check fails (nothing deleted).
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool>;

    /// The live record under `key`, if any.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<IdempotencyRecord>>;

    /// Deletes the record under `key` whatever its state (the handle's `forget`).
    /// `Ok(true)` when a live record was deleted.
    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool>;
}
