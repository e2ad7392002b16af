//! The bounded in-memory [`IdempotencyStore`], on the shared [`TtlMap`].

use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use toolshield_core::config::ConfigError;
use toolshield_core::size::{json_len, response_weight};
use toolshield_store::{MemoryBounds, StoreError, TtlMap, Write};

use crate::store::{
    check_resume_token, ClaimOutcome, IdempotencyRecord, IdempotencyStore, PendingClaim,
    RecordStatus, StoreFuture,
};

/// An [`IdempotencyStore`] in the memory of one process: a [`TtlMap`] of records.
///
/// Bounded by entries and by bytes ([`MemoryBounds`]; each record weighs its key plus the
/// memory it holds, [`record_weight`], and a payload kept with it its compact JSON
/// length), with a per-record TTL checked on every access against tokio's clock, and
/// atomic per key (every owner-checked operation is one [`TtlMap::update`] under the
/// shard's lock), so it is safe under any concurrency. Records are kept behind an `Arc`:
/// a replay (a claim that finds a live record) takes only the shard's shared lock, copies
/// a pointer, and builds no PENDING record ([`IdempotencyStore::claim_pending`]). Eviction is CLOCK (second chance): under
/// pressure, records not read since the hand last passed go first. A live claim (its call
/// still running) is never evicted: when a shard holds nothing else, a new claim is
/// refused with a [`StoreError`] instead (the layer fails closed, or open by config). Dedupe is exact only while the bounds hold every live record: size it
/// for the records kept over the record TTL (default 24 h).
///
/// A PENDING record whose lease ran out stays visible to the next claim for one more
/// lease (never to reads), so that claim is reported as a takeover, with the resume token
/// the record carried ([`IdempotencyStore::mark_resume`]); a claim with another payload
/// finds the lapsed record held: the key is still its payload's.
///
/// Clones share the same records.
#[derive(Clone, Debug)]
pub struct InMemoryIdempotencyStore {
    entries: TtlMap<Arc<IdempotencyRecord>>,
}

impl Default for InMemoryIdempotencyStore {
    fn default() -> Self {
        Self::over(TtlMap::new(Self::DEFAULT_BOUNDS))
    }
}

/// The memory a record kept by the in-memory store holds, as its weight against the
/// store's byte bound: the record itself, the strings it points to, and its response's
/// output as compact JSON with its provenance ([`response_weight`], which counts the
/// provenance record once more than the record's own size does: a weight that errs on
/// the heavy side). Walked, not serialised: a record is weighed on every write, under its
/// shard's lock.
///
/// ```
/// use std::time::Duration;
/// use toolshield_core::Digest;
/// use toolshield_idempotency::{record_weight, IdempotencyRecord};
///
/// let rec = IdempotencyRecord::pending(Digest::of_bytes(b"{}"), "owner-1", Duration::from_secs(60));
/// let base = std::mem::size_of::<IdempotencyRecord>();
/// assert_eq!(record_weight(&rec), base + "owner-1".len());
/// ```
pub fn record_weight(record: &IdempotencyRecord) -> usize {
    let strings = record.owner.len()
        + record.resume.as_ref().map_or(0, String::len)
        + record.error.as_ref().map_or(0, |e| e.message.len());
    std::mem::size_of::<IdempotencyRecord>()
        + strings
        + record.result.as_ref().map_or(0, response_weight)
}

impl InMemoryIdempotencyStore {
    /// The bounds of [`new`](Self::new): 100,000 records, 64 MiB.
    pub const DEFAULT_BOUNDS: MemoryBounds = MemoryBounds::new(100_000, 64 * 1024 * 1024);

    /// A store with the default bounds ([`DEFAULT_BOUNDS`](Self::DEFAULT_BOUNDS)).
    pub fn new() -> Self {
        Self::default()
    }

    /// A store with `bounds`; invalid bounds are an error.
    pub fn with_config(bounds: &MemoryBounds) -> Result<Self, ConfigError> {
        TtlMap::with_bounds(*bounds).map(Self::over)
    }

    fn over(entries: TtlMap<Arc<IdempotencyRecord>>) -> Self {
        InMemoryIdempotencyStore { entries }
    }

    /// The entries: their count, weighted size, and `purge_expired`.
    pub fn entries(&self) -> &TtlMap<Arc<IdempotencyRecord>> {
        &self.entries
    }

    /// The write of `record` under `key` for `ttl`, or an error when it cannot be held.
    fn put(
        &self,
        key: &str,
        mut record: IdempotencyRecord,
        ttl: Duration,
    ) -> Result<Write<Arc<IdempotencyRecord>>, StoreError> {
        let mut weight = key.len().saturating_add(record_weight(&record)) as u64;
        // The payload kept beside a record (never serialized) counts too; a record that
        // would not fit with it is kept without it (a replay then hashes the payload).
        if let Some(p) = &record.payload {
            let with = weight.saturating_add(json_len(p.value()) as u64);
            if with <= self.entries.max_weight() {
                weight = with;
            } else {
                record.payload = None;
            }
        }
        if weight > self.entries.max_weight() {
            return Err(StoreError::new(format!(
                "a record of {weight} bytes is larger than the in-memory store holds ({} bytes)",
                self.entries.max_weight()
            )));
        }
        // A lapsed claim lingers one more lease, so the next claim can tell a takeover. A
        // live claim is held: evicting it would free the key of a call still running, and
        // a duplicate would run it again.
        if record.status == RecordStatus::Pending {
            return Ok(Write::Hold {
                value: Arc::new(record),
                weight,
                ttl,
                linger: ttl,
            });
        }
        Ok(Write::Put {
            value: Arc::new(record),
            weight,
            ttl,
            linger: Duration::ZERO,
        })
    }

    fn claim_now(
        &self,
        key: &str,
        record: impl FnOnce() -> IdempotencyRecord,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        // A replay answers under the shard's shared lock, and builds nothing.
        if let Some(existing) = self.entries.get(key, |rec, _| Arc::clone(rec)) {
            return Ok(ClaimOutcome::Existing(existing));
        }
        let record = record();
        let mut too_large = None;
        let mut write =
            |record: IdempotencyRecord, outcome: ClaimOutcome| match self.put(key, record, lease) {
                Ok(put) => (put, outcome),
                Err(e) => {
                    too_large = Some(e);
                    (Write::Keep, ClaimOutcome::Claimed)
                }
            };
        let (outcome, stored) = self.entries.try_update(key, |found| match found {
            Some(f) if f.live => (Write::Keep, ClaimOutcome::Existing(Arc::clone(f.value))),
            // An expired claim holds its key against another payload: its owner may have
            // run the call (and any work it can resume was started) for its own payload,
            // so the key is still that payload's (`IDEMPOTENCY_KEY_REUSED`).
            Some(f)
                if f.value.status == RecordStatus::Pending
                    && f.value.payload_hash != record.payload_hash =>
            {
                (Write::Keep, ClaimOutcome::Existing(Arc::clone(f.value)))
            }
            // An expired claim that was never finished nor released: its resume token, if
            // any, moves into the new claim (unless it brings its own), so a second
            // takeover still finds it.
            Some(f) if f.value.status == RecordStatus::Pending => {
                let resume = f.value.resume.clone();
                let mut record = record;
                if record.resume.is_none() {
                    record.resume.clone_from(&resume);
                }
                write(record, ClaimOutcome::TakenOver { resume })
            }
            _ => write(record, ClaimOutcome::Claimed),
        });
        match too_large {
            Some(e) => Err(e),
            None if !stored => Err(full()),
            None => Ok(outcome),
        }
    }

    fn mark_resume_now(
        &self,
        key: &str,
        owner: &str,
        token: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        check_resume_token(token)?;
        self.rewrite_owned(key, owner, lease, |record| {
            record.resume = Some(token.to_owned());
        })
    }

    /// The owner check, then the PENDING record rewritten by `change` with a lease of
    /// `lease` from now; `Ok(false)` when the owner check fails, an error when the record
    /// no longer fits the store (nothing written).
    fn rewrite_owned(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        change: impl FnOnce(&mut IdempotencyRecord),
    ) -> Result<bool, StoreError> {
        let mut too_large = None;
        let (written, stored) = self.entries.try_update(key, |found| match found {
            Some(f) if f.live && f.value.is_owned_by(owner) => {
                let mut record = IdempotencyRecord::clone(f.value).with_lease(lease);
                change(&mut record);
                match self.put(key, record, lease) {
                    Ok(put) => (put, true),
                    Err(e) => {
                        too_large = Some(e);
                        (Write::Keep, false)
                    }
                }
            }
            _ => (Write::Keep, false),
        });
        match too_large {
            Some(e) => Err(e),
            None if !stored => Err(full()),
            None => Ok(written),
        }
    }

    /// The owner check, then `write`: the record is live, PENDING and owned by `owner`.
    /// An error when the write could not be stored (see [`full`]); the claim then stays.
    fn fenced(
        &self,
        key: &str,
        owner: &str,
        write: Write<Arc<IdempotencyRecord>>,
    ) -> Result<bool, StoreError> {
        let (owned, stored) = self.entries.try_update(key, |found| match found {
            Some(f) if f.live && f.value.is_owned_by(owner) => (write, true),
            _ => (Write::Keep, false),
        });
        if stored {
            Ok(owned)
        } else {
            Err(full())
        }
    }

    fn finish_now(
        &self,
        key: &str,
        owner: &str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        if !record.is_finished() {
            return Err(StoreError::new("finish takes a COMPLETED or FAILED record"));
        }
        let put = self.put(key, record, ttl)?;
        self.fenced(key, owner, put)
    }

    fn renew_now(&self, key: &str, owner: &str, lease: Duration) -> Result<bool, StoreError> {
        self.rewrite_owned(key, owner, lease, |_| {})
    }
}

/// The error of a write that found no room: the shard holds only live claims (calls still
/// running), which are never evicted. The caller fails closed (or open, by config) rather
/// than free the key of a running call.
fn full() -> StoreError {
    StoreError::new("the in-memory idempotency store is full of running claims")
}

impl IdempotencyStore for InMemoryIdempotencyStore {
    #[inline]
    fn finished_now(&self, key: &str) -> Option<Arc<IdempotencyRecord>> {
        self.entries
            .get(key, |rec, _| rec.is_finished().then(|| Arc::clone(rec)))
            .flatten()
    }

    fn claim<'a>(
        &'a self,
        key: &'a str,
        record: IdempotencyRecord,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(ready(self.claim_now(key, || record, lease)))
    }

    fn claim_pending<'a>(
        &'a self,
        key: &'a str,
        claim: PendingClaim<'a>,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(ready(self.claim_now(key, || claim.record(lease), lease)))
    }

    fn finish<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: IdempotencyRecord,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(ready(self.finish_now(key, owner, record, ttl)))
    }

    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        Box::pin(ready(self.renew_now(key, owner, lease)))
    }

    fn mark_resume<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(ready(self.mark_resume_now(key, owner, token, lease)))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(ready(self.fenced(key, owner, Write::Remove)))
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<IdempotencyRecord>> {
        Box::pin(ready(Ok(self
            .entries
            .get(key, |rec, _| IdempotencyRecord::clone(rec)))))
    }

    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(ready(Ok(self.entries.remove(key))))
    }
}
