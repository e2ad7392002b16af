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
        ended_claims_are_not_takeovers(&make()).await;
        finished_records_expire(&make()).await;
        remove_deletes_any_state(&make()).await;
        concurrent_claims_have_one_winner(Arc::new(make())).await;
        records_round_trip(&make()).await;
        finish_takes_an_outcome(&make()).await;
        mark_resume_is_fenced(&make()).await;
        mark_resume_renews_the_lease(&make()).await;
        resume_token_survives_takeovers(&make()).await;
        takeover_without_a_mark_has_no_token(&make()).await;
        ended_claims_forget_their_token(&make()).await;
        hostile_resume_tokens_are_refused(&make()).await;
        odd_resume_tokens_round_trip(&make()).await;
        resume_token_stays_with_its_payload(&make()).await;
        a_lapsed_claim_holds_its_key_against_another_payload(&make()).await;
    }

    async fn mark<S: IdempotencyStore + ?Sized>(s: &S, k: &str, owner: &str, token: &str) -> bool {
        ok(s.mark_resume(k, owner, token, LEASE).await, "mark_resume")
    }

    /// Only the PENDING owner may mark a resume token; the record reads back with it, a
    /// second mark replaces it, and a finished record carries none and takes none.
    pub async fn mark_resume_is_fenced<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("mark");
        assert!(
            !mark(s, &k, "a", "task-1").await,
            "no record: nothing to mark"
        );
        claim(s, &k, "a").await;
        assert!(
            !mark(s, &k, "b", "task-1").await,
            "another owner must not mark the claim"
        );
        let rec = ok(s.get(&k).await, "get").expect("the claim is there");
        assert_eq!(rec.resume, None, "a refused mark writes nothing");
        assert!(
            mark(s, &k, "a", "task-1").await,
            "the owner marks its claim"
        );
        let rec = ok(s.get(&k).await, "get").expect("the marked claim is there");
        assert_eq!(rec.resume.as_deref(), Some("task-1"));
        assert!(
            rec.is_owned_by("a"),
            "marking keeps the claim PENDING and its owner"
        );
        assert_eq!(rec.payload_hash, hash("p"));
        assert!(mark(s, &k, "a", "task-2").await);
        let rec = ok(s.get(&k).await, "get").expect("the marked claim is there");
        assert_eq!(
            rec.resume.as_deref(),
            Some("task-2"),
            "a new mark replaces the old"
        );
        assert!(
            ok(s.renew(&k, "a", LEASE).await, "renew"),
            "a marked claim can be renewed"
        );
        let rec = ok(s.get(&k).await, "get").expect("the renewed claim is there");
        assert_eq!(
            rec.resume.as_deref(),
            Some("task-2"),
            "renewing keeps the mark"
        );
        assert!(ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"));
        let rec = ok(s.get(&k).await, "get").expect("completed record");
        assert_eq!(rec.status, RecordStatus::Completed);
        assert_eq!(rec.resume, None, "an outcome replaces the mark");
        assert!(
            !mark(s, &k, "a", "task-3").await,
            "a finished record must not be marked"
        );
    }

    /// Marking proves the owner alive: it renews the lease as `renew` does.
    pub async fn mark_resume_renews_the_lease<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("mark-lease");
        claim(s, &k, "a").await;
        sleep(LEASE * 3 / 4).await;
        assert!(mark(s, &k, "a", "task-1").await);
        sleep(LEASE * 3 / 4).await;
        let rec = ok(s.get(&k).await, "get").expect("a marked claim must outlive its first lease");
        assert!(rec.is_owned_by("a"));
        assert!(matches!(claim(s, &k, "b").await, ClaimOutcome::Existing(_)));
    }

    /// The token of a claim whose lease expired reaches the owner that takes it over, and
    /// stays on the new claim, so the owner after that (the taker died too) gets it as well.
    pub async fn resume_token_survives_takeovers<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("resume");
        claim(s, &k, "a").await;
        assert!(mark(s, &k, "a", "task-1").await);
        sleep(LEASE + LEASE / 2).await;
        assert!(
            ok(s.get(&k).await, "get").is_none(),
            "an expired marked claim must not be readable"
        );
        assert!(
            !mark(s, &k, "a", "task-9").await,
            "an expired claim cannot be marked"
        );
        assert_eq!(
            claim(s, &k, "b").await,
            ClaimOutcome::TakenOver {
                resume: Some("task-1".to_owned())
            },
            "the takeover must carry the expired claim's resume token"
        );
        let rec = ok(s.get(&k).await, "get").expect("the new claim");
        assert!(rec.is_owned_by("b"));
        assert_eq!(
            rec.resume.as_deref(),
            Some("task-1"),
            "the new claim keeps the token"
        );
        assert!(
            !mark(s, &k, "a", "task-9").await,
            "the old owner cannot mark the new owner's claim"
        );
        // The taker dies too, without marking anything of its own.
        sleep(LEASE + LEASE / 2).await;
        assert_eq!(
            claim(s, &k, "c").await,
            ClaimOutcome::TakenOver {
                resume: Some("task-1".to_owned())
            },
            "a second takeover still finds the token"
        );
        assert!(ok(s.finish(&k, "c", completed("c"), TTL).await, "finish"));
    }

    /// The resume token of a claim whose lease expired names work done for that claim's
    /// payload: a claim of the key with another payload within the takeover window finds
    /// the key held (the lapsed claim, with its payload digest) and neither gets the token
    /// nor clears it, so a claim with the first payload still takes over and resumes.
    pub async fn resume_token_stays_with_its_payload<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("resume-payload");
        claim(s, &k, "a").await;
        assert!(mark(s, &k, "a", "task-1").await);
        sleep(LEASE + LEASE / 2).await;
        let other = IdempotencyRecord::pending(hash("another payload"), "b", LEASE);
        match ok(s.claim(&k, other, LEASE).await, "claim") {
            ClaimOutcome::Existing(rec) => assert_eq!(
                rec.payload_hash,
                hash("p"),
                "the key is held for the payload its work was started with"
            ),
            found => panic!("another payload must not take over resumable work: {found:?}"),
        }
        assert_eq!(
            claim(s, &k, "c").await,
            ClaimOutcome::TakenOver {
                resume: Some("task-1".to_owned())
            },
            "the payload the work belongs to still resumes it"
        );
        assert!(ok(s.finish(&k, "c", completed("c"), TTL).await, "finish"));
    }

    /// The same key with another payload is refused while the store still knows the
    /// payload of the key's last claim: a claim of the key with another payload digest
    /// within the takeover window of a lapsed claim (marked or not) finds the key held,
    /// with the lapsed claim's digest, and writes nothing; the first payload still takes
    /// the claim over.
    pub async fn a_lapsed_claim_holds_its_key_against_another_payload<
        S: IdempotencyStore + ?Sized,
    >(
        s: &S,
    ) {
        let k = key("lapsed-payload");
        claim(s, &k, "a").await;
        sleep(LEASE + LEASE / 2).await;
        let other = IdempotencyRecord::pending(hash("another payload"), "b", LEASE);
        match ok(s.claim(&k, other, LEASE).await, "claim") {
            ClaimOutcome::Existing(rec) => assert_eq!(
                rec.payload_hash,
                hash("p"),
                "the key is held for the payload it was claimed with"
            ),
            found => panic!("another payload must not take over a lapsed claim: {found:?}"),
        }
        assert!(
            ok(s.get(&k).await, "get").is_none(),
            "a refused claim writes nothing"
        );
        assert_eq!(
            claim(s, &k, "c").await,
            ClaimOutcome::TakenOver { resume: None },
            "the payload the key was claimed with still takes it over"
        );
        assert!(ok(s.finish(&k, "c", completed("c"), TTL).await, "finish"));
    }

    /// A takeover of a claim that was never marked reports no token.
    pub async fn takeover_without_a_mark_has_no_token<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("no-mark");
        claim(s, &k, "a").await;
        assert!(ok(s.renew(&k, "a", LEASE).await, "renew"));
        sleep(LEASE + LEASE / 2).await;
        assert_eq!(
            claim(s, &k, "b").await,
            ClaimOutcome::TakenOver { resume: None }
        );
        let rec = ok(s.get(&k).await, "get").expect("the new claim");
        assert_eq!(rec.resume, None);
    }

    /// A marked claim that ended (released, or finished and expired) leaves no token for
    /// the next claim.
    pub async fn ended_claims_forget_their_token<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("mark-ended");
        claim(s, &k, "a").await;
        assert!(mark(s, &k, "a", "task-1").await);
        assert!(ok(s.release(&k, "a").await, "release"));
        assert_eq!(
            claim(s, &k, "b").await,
            ClaimOutcome::Claimed,
            "a released claim is not taken over"
        );
        let rec = ok(s.get(&k).await, "get").expect("the new claim");
        assert_eq!(rec.resume, None, "a released claim's token is gone");
        assert!(mark(s, &k, "b", "task-2").await);
        assert!(ok(s.finish(&k, "b", completed("b"), TTL).await, "finish"));
        sleep(TTL + LEASE / 2).await;
        assert_eq!(claim(s, &k, "c").await, ClaimOutcome::Claimed);
        let rec = ok(s.get(&k).await, "get").expect("the new claim");
        assert_eq!(rec.resume, None, "a finished claim's token is gone");
    }

    /// Tokens that are empty, too long or carry control characters are refused with an
    /// error, and the claim is left as it was; the longest accepted token is stored.
    pub async fn hostile_resume_tokens_are_refused<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("mark-hostile");
        claim(s, &k, "a").await;
        let long = "x".repeat(crate::MAX_RESUME_TOKEN_LEN + 1);
        let huge = "h".repeat(1 << 20);
        for bad in [
            "",
            long.as_str(),
            huge.as_str(),
            "task\n1",
            "task\r\n",
            "\u{1b}[31mred",
            "nul\0",
            "tab\t",
            "\u{85}next-line",
        ] {
            assert!(
                s.mark_resume(&k, "a", bad, LEASE).await.is_err(),
                "a token of {} bytes ({:?}...) must be refused",
                bad.len(),
                bad.chars().take(8).collect::<String>()
            );
            assert!(
                s.mark_resume(&k, "b", bad, LEASE).await.is_err(),
                "refused whoever asks"
            );
        }
        let rec = ok(s.get(&k).await, "get").expect("the claim is still there");
        assert!(rec.is_owned_by("a"), "a refused mark leaves the claim");
        assert_eq!(rec.resume, None, "a refused mark writes nothing");
        let longest = "é".repeat(crate::MAX_RESUME_TOKEN_LEN / 2);
        assert!(
            mark(s, &k, "a", &longest).await,
            "the longest token is kept"
        );
        let rec = ok(s.get(&k).await, "get").expect("the claim");
        assert_eq!(rec.resume.as_deref(), Some(longest.as_str()));
    }

    /// A token made of JSON syntax, quotes, backslashes and non-ASCII text reads back
    /// exactly, from `get` and through a takeover, and leaves the record intact.
    pub async fn odd_resume_tokens_round_trip<S: IdempotencyStore + ?Sized>(s: &S) {
        for (i, token) in [
            r#"","resume":"evil"#,
            r#"\"},{"status":"COMPLETED"#,
            "/tâche/✓ 42",
            "}",
        ]
        .into_iter()
        .enumerate()
        {
            let k = key(&format!("mark-odd-{i}"));
            claim(s, &k, "a").await;
            assert!(mark(s, &k, "a", token).await);
            let rec = ok(s.get(&k).await, "get").expect("the marked claim");
            assert_eq!(rec.resume.as_deref(), Some(token), "read back as written");
            assert!(rec.is_owned_by("a"), "the record is intact: {rec:?}");
            assert_eq!(rec.payload_hash, hash("p"));
            assert!(mark(s, &k, "a", token).await, "marking twice works too");
            sleep(LEASE + LEASE / 2).await;
            assert_eq!(
                claim(s, &k, "b").await,
                ClaimOutcome::TakenOver {
                    resume: Some(token.to_owned())
                },
                "the taker reads the token as written"
            );
            let rec = ok(s.get(&k).await, "get").expect("the new claim");
            assert_eq!(rec.resume.as_deref(), Some(token));
            assert!(rec.is_owned_by("b"));
        }
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
            ClaimOutcome::Claimed | ClaimOutcome::TakenOver { .. } => {
                panic!("a held key must not be claimed twice")
            }
        }
        assert!(ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"));
        match claim(s, &k, "c").await {
            ClaimOutcome::Existing(rec) => assert_eq!(rec.status, RecordStatus::Completed),
            ClaimOutcome::Claimed | ClaimOutcome::TakenOver { .. } => {
                panic!("a completed key must not be claimed")
            }
        }
    }

    /// Only the PENDING owner may complete.
    pub async fn complete_is_fenced<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("complete");
        assert!(
            !ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"),
            "no record: nothing to complete"
        );
        claim(s, &k, "a").await;
        assert!(
            !ok(s.finish(&k, "b", completed("b"), TTL).await, "finish"),
            "another owner must not complete"
        );
        assert!(ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"));
        assert!(
            !ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"),
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
            !ok(s.finish(&k, "b", rec, TTL).await, "finish"),
            "another owner must not fail the record"
        );
        let rec = IdempotencyRecord::failed(hash("p"), "a", &err, TTL);
        assert!(ok(s.finish(&k, "a", rec, TTL).await, "fail"));
        let got = ok(s.get(&k).await, "get").expect("failed record");
        assert_eq!(got.status, RecordStatus::Failed);
        assert_eq!(got.error.map(|e| e.kind), Some(ErrorKind::InvalidInput));
    }

    /// `finish` takes a COMPLETED or FAILED record: a PENDING one is an error, and the
    /// claim is left as it was.
    pub async fn finish_takes_an_outcome<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("finish-pending");
        claim(s, &k, "a").await;
        assert!(
            s.finish(&k, "a", pending("a"), TTL).await.is_err(),
            "finish must refuse a PENDING record"
        );
        let rec = ok(s.get(&k).await, "get").expect("the claim is still there");
        assert!(rec.is_owned_by("a"), "a refused finish writes nothing");
        assert!(ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"));
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
        assert!(ok(s.finish(&k, "b", completed("b"), TTL).await, "finish"));
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
            ClaimOutcome::TakenOver { resume: None },
            "an expired lease must be taken over, and reported as a takeover (with no resume \
             token: none was marked)"
        );
        assert!(
            !ok(s.renew(&k, "a", LEASE).await, "renew"),
            "the old owner cannot renew the new owner's claim"
        );
        assert!(
            !ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"),
            "the old owner is fenced off"
        );
        assert!(
            !ok(s.release(&k, "a").await, "release"),
            "the old owner cannot release the new owner's claim"
        );
        let err = ToolError::new(ErrorKind::Timeout, "late");
        assert!(
            !ok(
                s.finish(
                    &k,
                    "a",
                    IdempotencyRecord::failed(hash("p"), "a", &err, TTL),
                    TTL
                )
                .await,
                "finish"
            ),
            "the old owner cannot fail the new owner's claim"
        );
        let rec = ok(s.get(&k).await, "get").expect("the new claim is still there");
        assert!(rec.is_owned_by("b"), "the new owner still holds the key");
        assert!(ok(s.finish(&k, "b", completed("b"), TTL).await, "finish"));
    }

    /// A claim that ended (released, or finished and expired) leaves nothing that reads as
    /// a takeover: the next claim is a plain one.
    pub async fn ended_claims_are_not_takeovers<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("no-takeover");
        assert_eq!(claim(s, &k, "a").await, ClaimOutcome::Claimed);
        assert!(ok(s.release(&k, "a").await, "release"));
        assert_eq!(
            claim(s, &k, "b").await,
            ClaimOutcome::Claimed,
            "a released claim is not taken over"
        );
        assert!(ok(s.finish(&k, "b", completed("b"), TTL).await, "finish"));
        sleep(TTL + LEASE / 2).await;
        assert_eq!(
            claim(s, &k, "c").await,
            ClaimOutcome::Claimed,
            "an expired COMPLETED record is not taken over"
        );
    }

    /// COMPLETED and FAILED records live for the TTL given when they were written.
    pub async fn finished_records_expire<S: IdempotencyStore + ?Sized>(s: &S) {
        let k = key("ttl");
        claim(s, &k, "a").await;
        assert!(ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"));
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
        assert!(ok(s.finish(&k, "a", completed("a"), TTL).await, "finish"));
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
        assert!(ok(s.finish(&k, "a", rec.clone(), TTL).await, "complete"));
        let got = ok(s.get(&k).await, "get").expect("record");
        assert_eq!(
            got.result, rec.result,
            "the stored response must read back unchanged"
        );
        assert_eq!(got.payload_hash, rec.payload_hash);
    }
}

/// An [`IdempotencyStore`](crate::IdempotencyStore) that injects faults, for fault tests
/// of the layer and of any store.
///
/// It wraps a store and asks a [`FaultPlan`](toolshield_core::faults::FaultPlan) before
/// each operation what to do: pass it through, fail it, delay it, apply it and then fail
/// (the reply was lost), fail at once and apply it later in the background (a command still
/// on the wire, as when a paused server resumes: operations sent after it are applied after
/// it, as a server applies the commands of one connection in order), or hang. The operation
/// names are the trait's method names, `claim`, `renew`, `mark_resume`, `release`, `get`,
/// `remove`, except
/// that `finish` is asked as `complete` (a COMPLETED record) or `fail` (a FAILED one), so
/// a plan can fail one outcome and not the other.
///
/// ```
/// use std::sync::Arc;
/// use toolshield_core::faults::{Fault, FaultPlan};
/// use toolshield_idempotency::testing::FaultyStore;
/// use toolshield_idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let plan = FaultPlan::new();
/// let store = FaultyStore::new(Arc::new(InMemoryIdempotencyStore::new()), plan.clone());
/// plan.once("get", Fault::Fail);
/// assert!(store.get("idemp:{pay}:-:g:k").await.is_err());
/// assert!(store.get("idemp:{pay}:-:g:k").await.unwrap().is_none());
/// # }
/// ```
pub struct FaultyStore<S: ?Sized> {
    inner: std::sync::Arc<S>,
    plan: toolshield_core::faults::FaultPlan,
    /// Held for writing by an operation that lands later; every operation waits for it.
    order: std::sync::Arc<tokio::sync::RwLock<()>>,
}

impl<S: ?Sized> std::fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl<S: ?Sized> Clone for FaultyStore<S> {
    fn clone(&self) -> Self {
        FaultyStore {
            inner: std::sync::Arc::clone(&self.inner),
            plan: self.plan.clone(),
            order: std::sync::Arc::clone(&self.order),
        }
    }
}

mod faulty {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Duration;

    use toolshield_core::faults::{Fault, FaultPlan};

    use super::FaultyStore;
    use crate::store::{
        ClaimOutcome, IdempotencyRecord, IdempotencyStore, RecordStatus, StoreError, StoreFuture,
    };

    impl<S: IdempotencyStore + ?Sized> FaultyStore<S> {
        /// `inner` with the faults of `plan` (clones of the plan script this store).
        pub fn new(inner: Arc<S>, plan: FaultPlan) -> Self {
            FaultyStore {
                inner,
                plan,
                order: Arc::default(),
            }
        }

        /// The plan.
        pub fn plan(&self) -> &FaultPlan {
            &self.plan
        }

        /// The wrapped store.
        pub fn inner(&self) -> &Arc<S> {
            &self.inner
        }

        fn faulty<'a, T, F, Fut>(&'a self, op: &'static str, make: F) -> StoreFuture<'a, T>
        where
            T: Send + 'static,
            F: FnOnce(Arc<S>) -> Fut + Send + 'static,
            Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
        {
            let fault = self.plan.next(op);
            let inner = Arc::clone(&self.inner);
            // Taken now, before this call returns, so operations sent after it wait.
            let landing = match fault {
                Some(Fault::ApplyLater(_)) => Arc::clone(&self.order).try_write_owned().ok(),
                _ => None,
            };
            let order = Arc::clone(&self.order);
            Box::pin(async move {
                if landing.is_none() {
                    // Applied after every operation still landing.
                    drop(order.read().await);
                }
                match fault {
                    None => make(inner).await,
                    Some(Fault::Fail) => Err(StoreError::new(format!("injected: {op} failed"))),
                    Some(Fault::Delay(d)) => {
                        tokio::time::sleep(d).await;
                        make(inner).await
                    }
                    Some(Fault::ApplyThenFail) => {
                        let _applied = make(inner).await;
                        Err(StoreError::new(format!(
                            "injected: {op} timed out after it was applied"
                        )))
                    }
                    Some(Fault::ApplyLater(d)) => {
                        tokio::spawn(async move {
                            tokio::time::sleep(d).await;
                            let _applied = make(inner).await;
                            drop(landing);
                        });
                        Err(StoreError::new(format!(
                            "injected: {op} timed out; it lands later"
                        )))
                    }
                    Some(Fault::Hang) => std::future::pending().await,
                }
            })
        }
    }

    impl<S: IdempotencyStore + ?Sized> IdempotencyStore for FaultyStore<S> {
        fn op_timeout(&self) -> Option<Duration> {
            self.inner.op_timeout()
        }

        fn claim<'a>(
            &'a self,
            key: &'a str,
            record: IdempotencyRecord,
            lease: Duration,
        ) -> StoreFuture<'a, ClaimOutcome> {
            let key = key.to_owned();
            self.faulty("claim", move |s| async move {
                s.claim(&key, record, lease).await
            })
        }

        fn finish<'a>(
            &'a self,
            key: &'a str,
            owner: &'a str,
            record: IdempotencyRecord,
            ttl: Duration,
        ) -> StoreFuture<'a, bool> {
            // Asked as `complete` or `fail`, so a plan can fail one outcome and not the other.
            let op = if record.status == RecordStatus::Failed {
                "fail"
            } else {
                "complete"
            };
            let (key, owner) = (key.to_owned(), owner.to_owned());
            self.faulty(op, move |s| async move {
                s.finish(&key, &owner, record, ttl).await
            })
        }

        fn renew<'a>(
            &'a self,
            key: &'a str,
            owner: &'a str,
            lease: Duration,
        ) -> StoreFuture<'a, bool> {
            let (key, owner) = (key.to_owned(), owner.to_owned());
            self.faulty("renew", move |s| async move {
                s.renew(&key, &owner, lease).await
            })
        }

        fn mark_resume<'a>(
            &'a self,
            key: &'a str,
            owner: &'a str,
            token: &'a str,
            lease: Duration,
        ) -> StoreFuture<'a, bool> {
            let (key, owner, token) = (key.to_owned(), owner.to_owned(), token.to_owned());
            self.faulty("mark_resume", move |s| async move {
                s.mark_resume(&key, &owner, &token, lease).await
            })
        }

        fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
            let (key, owner) = (key.to_owned(), owner.to_owned());
            self.faulty(
                "release",
                move |s| async move { s.release(&key, &owner).await },
            )
        }

        fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<IdempotencyRecord>> {
            let key = key.to_owned();
            self.faulty("get", move |s| async move { s.get(&key).await })
        }

        fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
            let key = key.to_owned();
            self.faulty("remove", move |s| async move { s.remove(&key).await })
        }
    }
}
