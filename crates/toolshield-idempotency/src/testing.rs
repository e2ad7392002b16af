//! Test support for store implementations (feature `testing`).

/// The contract every [`IdempotencyStore`](crate::IdempotencyStore) must pass.
///
/// Each check takes a fresh store and panics with a message naming the broken rule.
/// Waits are `tokio::time::sleep` on the short leases and TTLs the checks pass to the
/// store itself (a few hundred milliseconds), so the same suite runs under a paused tokio
/// clock for the in-memory store and in real time against Redis.
///
/// ```no_run
/// # async fn demo() {
/// use toolshield_idempotency::{testing::contract, InMemoryIdempotencyStore};
/// contract::run_all(InMemoryIdempotencyStore::new).await;
/// # }
/// ```
pub mod contract {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;
    use tokio::time::sleep;
    use toolshield_core::{Digest, ErrorKind, ToolError, ToolResponse};

    use crate::store::{ClaimOutcome, IdempotencyRecord, IdempotencyStore, RecordStatus};

    /// The lease the checks use.
    pub const LEASE: Duration = Duration::from_millis(200);
    /// The TTL of finished records in the checks.
    pub const TTL: Duration = Duration::from_millis(400);

    fn hash(s: &str) -> Digest {
        Digest::of_bytes(s.as_bytes())
    }

    fn pending(owner: &str) -> IdempotencyRecord {
        IdempotencyRecord::pending(hash("p"), owner, LEASE)
    }

    fn completed(owner: &str) -> IdempotencyRecord {
        let mut resp = ToolResponse::new(json!({"charged": 42, "nested": {"ok": true}}));
        resp.provenance.fetched_at = Some(chrono::Utc::now());
        IdempotencyRecord::completed(hash("p"), owner, resp, TTL)
    }

    fn key(name: &str) -> String {
        format!("idemp:{{contract}}:{name}-{}", uuid_like())
    }

    fn uuid_like() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ N
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    async fn claim<S: IdempotencyStore + ?Sized>(s: &S, k: &str, owner: &str) -> ClaimOutcome {
        match s.claim(k, pending(owner), LEASE).await {
            Ok(o) => o,
            Err(e) => panic!("claim failed: {e}"),
        }
    }

    fn ok<T>(r: Result<T, crate::StoreError>, what: &str) -> T {
        match r {
            Ok(v) => v,
            Err(e) => panic!("{what} failed: {e}"),
        }
    }

    /// Runs every check, each on a fresh store from `make`.
    pub async fn run_all<S, F>(make: F)
    where
        S: IdempotencyStore,
        F: Fn() -> S,
    {
        claim_creates_pending(&make()).await;
        claim_returns_existing(&make()).await;
        complete_is_fenced(&make()).await;
        fail_is_fenced(&make()).await;
        release_is_fenced(&make()).await;
        renew_extends_the_lease(&make()).await;
        expired_lease_is_taken_over(&make()).await;
        finished_records_expire(&make()).await;
        remove_deletes_any_state(&make()).await;
        concurrent_claims_have_one_winner(Arc::new(make())).await;
        records_round_trip(&make()).await;
    }

    /// A free key is claimed; the record reads back PENDING with its owner.
    pub async fn claim_creates_pending<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("claim");
        assert_eq!(
            claim(s, &k, "a").await,
            ClaimOutcome::Claimed,
            "a free key must be claimed"
        );
        let rec = ok(s.get(&k).await, "get").expect("claimed record must be readable");
        assert_eq!(rec.status, RecordStatus::Pending);
        assert_eq!(rec.owner, "a");
        assert_eq!(rec.payload_hash, hash("p"));
    }

    /// A second claim returns the live record and writes nothing.
    pub async fn claim_returns_existing<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("existing");
        assert_eq!(claim(s, &k, "a").await, ClaimOutcome::Claimed);
        match claim(s, &k, "b").await {
            ClaimOutcome::Existing(rec) => {
                assert_eq!(
                    rec.owner, "a",
                    "the existing record must be returned untouched"
                )
            }
            ClaimOutcome::Claimed => panic!("a held key must not be claimed twice"),
        }
        assert!(ok(
            s.complete(&k, "a", completed("a"), TTL).await,
            "complete"
        ));
        match claim(s, &k, "c").await {
            ClaimOutcome::Existing(rec) => assert_eq!(rec.status, RecordStatus::Completed),
            ClaimOutcome::Claimed => panic!("a completed key must not be claimed"),
        }
    }

    /// Only the PENDING owner may complete.
    pub async fn complete_is_fenced<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("complete");
        assert!(
            !ok(s.complete(&k, "a", completed("a"), TTL).await, "complete"),
            "no record: nothing to complete"
        );
        claim(s, &k, "a").await;
        assert!(
            !ok(s.complete(&k, "b", completed("b"), TTL).await, "complete"),
            "another owner must not complete"
        );
        assert!(ok(
            s.complete(&k, "a", completed("a"), TTL).await,
            "complete"
        ));
        assert!(
            !ok(s.complete(&k, "a", completed("a"), TTL).await, "complete"),
            "a completed record is no longer PENDING"
        );
        let rec = ok(s.get(&k).await, "get").expect("completed record");
        assert_eq!(rec.status, RecordStatus::Completed);
        assert_eq!(
            rec.result.map(|r| r.output),
            Some(json!({"charged": 42, "nested": {"ok": true}}))
        );
    }

    /// Only the PENDING owner may fail; the error reads back.
    pub async fn fail_is_fenced<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("fail");
        claim(s, &k, "a").await;
        let err = ToolError::new(ErrorKind::InvalidInput, "bad amount");
        let rec = IdempotencyRecord::failed(hash("p"), "b", &err, TTL);
        assert!(
            !ok(s.fail(&k, "b", rec, TTL).await, "fail"),
            "another owner must not fail the record"
        );
        let rec = IdempotencyRecord::failed(hash("p"), "a", &err, TTL);
        assert!(ok(s.fail(&k, "a", rec, TTL).await, "fail"));
        let got = ok(s.get(&k).await, "get").expect("failed record");
        assert_eq!(got.status, RecordStatus::Failed);
        assert_eq!(got.error.map(|e| e.kind), Some(ErrorKind::InvalidInput));
    }

    /// Only the PENDING owner may release; a finished record is never released.
    pub async fn release_is_fenced<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("release");
        claim(s, &k, "a").await;
        assert!(
            !ok(s.release(&k, "b").await, "release"),
            "another owner must not release"
        );
        assert!(ok(s.release(&k, "a").await, "release"));
        assert!(
            ok(s.get(&k).await, "get").is_none(),
            "a released key is free"
        );
        assert_eq!(
            claim(s, &k, "b").await,
            ClaimOutcome::Claimed,
            "a released key can be claimed again"
        );
        assert!(ok(
            s.complete(&k, "b", completed("b"), TTL).await,
            "complete"
        ));
        assert!(
            !ok(s.release(&k, "b").await, "release"),
            "a completed record must not be released"
        );
        assert!(ok(s.get(&k).await, "get").is_some());
    }

    /// Renewing keeps a claim alive past its first lease; a stranger cannot renew.
    pub async fn renew_extends_the_lease<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("renew");
        claim(s, &k, "a").await;
        assert!(
            !ok(s.renew(&k, "b", LEASE).await, "renew"),
            "another owner must not renew"
        );
        sleep(LEASE * 3 / 4).await;
        assert!(ok(s.renew(&k, "a", LEASE).await, "renew"));
        sleep(LEASE * 3 / 4).await;
        let rec = ok(s.get(&k).await, "get").expect("a renewed claim must outlive its first lease");
        assert_eq!(rec.owner, "a");
        assert!(matches!(claim(s, &k, "b").await, ClaimOutcome::Existing(_)));
    }

    /// A claim whose lease ran out is gone: the next claim takes the key over, and the old
    /// owner can no longer complete it.
    pub async fn expired_lease_is_taken_over<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("takeover");
        claim(s, &k, "a").await;
        sleep(LEASE + LEASE / 2).await;
        assert!(
            ok(s.get(&k).await, "get").is_none(),
            "an expired claim must not be readable"
        );
        assert!(
            !ok(s.renew(&k, "a", LEASE).await, "renew"),
            "an expired lease cannot be renewed"
        );
        assert_eq!(
            claim(s, &k, "b").await,
            ClaimOutcome::Claimed,
            "an expired lease must be taken over"
        );
        assert!(
            !ok(s.complete(&k, "a", completed("a"), TTL).await, "complete"),
            "the old owner is fenced off"
        );
        assert!(ok(
            s.complete(&k, "b", completed("b"), TTL).await,
            "complete"
        ));
    }

    /// COMPLETED and FAILED records live for the TTL given when they were written.
    pub async fn finished_records_expire<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("ttl");
        claim(s, &k, "a").await;
        assert!(ok(
            s.complete(&k, "a", completed("a"), TTL).await,
            "complete"
        ));
        sleep(LEASE + LEASE / 4).await;
        assert!(
            ok(s.get(&k).await, "get").is_some(),
            "a completed record lives for its TTL, not the lease"
        );
        sleep(TTL).await;
        assert!(
            ok(s.get(&k).await, "get").is_none(),
            "a completed record must expire after its TTL"
        );
        assert_eq!(claim(s, &k, "b").await, ClaimOutcome::Claimed);
    }

    /// `remove` deletes a record in any state.
    pub async fn remove_deletes_any_state<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("remove");
        assert!(!ok(s.remove(&k).await, "remove"), "nothing to remove");
        claim(s, &k, "a").await;
        assert!(ok(s.remove(&k).await, "remove"));
        claim(s, &k, "a").await;
        assert!(ok(
            s.complete(&k, "a", completed("a"), TTL).await,
            "complete"
        ));
        assert!(ok(s.remove(&k).await, "remove"));
        assert!(ok(s.get(&k).await, "get").is_none());
    }

    /// Of many concurrent claims on one key, exactly one wins.
    pub async fn concurrent_claims_have_one_winner<S: IdempotencyStore>(s: Arc<S>) {
        let k = Arc::new(key("race"));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..32 {
            let (s, k) = (Arc::clone(&s), Arc::clone(&k));
            set.spawn(async move { claim(&*s, &k, &format!("owner-{i}")).await });
        }
        let mut winners = 0;
        while let Some(r) = set.join_next().await {
            if matches!(r, Ok(ClaimOutcome::Claimed)) {
                winners += 1;
            }
        }
        assert_eq!(winners, 1, "exactly one concurrent claim must win");
    }

    /// A record with a response survives the store intact (JSON round trip for shared stores).
    pub async fn records_round_trip<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("roundtrip");
        claim(s, &k, "a").await;
        let rec = completed("a");
        assert!(ok(s.complete(&k, "a", rec.clone(), TTL).await, "complete"));
        let got = ok(s.get(&k).await, "get").expect("record");
        assert_eq!(
            got.result, rec.result,
            "the stored response must read back unchanged"
        );
        assert_eq!(got.payload_hash, rec.payload_hash);
    }
}
