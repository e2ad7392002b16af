//! Clients on separate connections race claims, outcomes and releases on a few keys while
//! the (persistent) server is paused, killed and restarted; a checker of every answer
//! holds the store to its fencing: no two live claims on a key, one recorded outcome per
//! key, and a key with a recorded outcome never claimed again.
//!
//! On real time, as every test against a real server here: the leases expire on the Redis
//! server's clock, which tokio's paused clock does not move.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, prefix};
use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{Digest, ToolResponse};
use toolshield_idempotency::{ClaimOutcome, IdempotencyRecord, IdempotencyStore, RecordStatus};
use toolshield_redis::testing::private_persistent_redis;
use toolshield_redis::RedisIdempotencyStore;
use toolshield_test::Rng;

const CLIENTS: usize = 4;
const KEYS: usize = 3;
const LEASE: Duration = Duration::from_millis(600);
const OP_TIMEOUT: Duration = Duration::from_millis(150);
const RECORD_TTL: Duration = Duration::from_secs(600);

/// What the checker knows of one key.
#[derive(Default)]
struct KeyState {
    /// The live claim acknowledged to its owner: owner and when its claim was sent (the
    /// record cannot expire before that instant plus the lease).
    holder: Option<(String, Instant)>,
    /// Owners whose outcome write was acknowledged.
    completed_by: Vec<String>,
}

#[derive(Default)]
struct Checker {
    keys: HashMap<usize, KeyState>,
    violations: Vec<String>,
    claims: usize,
    outcomes: usize,
}

impl Checker {
    fn claimed(&mut self, key: usize, owner: &str, sent: Instant, acked: Instant) {
        self.claims += 1;
        let s = self.keys.entry(key).or_default();
        if !s.completed_by.is_empty() {
            self.violations.push(format!(
                "key {key}: {owner} claimed a key completed by {:?}",
                s.completed_by
            ));
        }
        if let Some((other, since)) = &s.holder {
            // The other claim's record lives at least until `since + LEASE` (its TTL starts
            // when Redis runs the claim, after it was sent); a claim acknowledged before
            // that is a second live claim.
            if other != owner && acked < *since + LEASE {
                self.violations.push(format!(
                    "key {key}: {owner} claimed while {other} held it ({:?} into its lease)",
                    acked - *since
                ));
            }
        }
        s.holder = Some((owner.to_owned(), sent));
    }

    fn ended(&mut self, key: usize, owner: &str) {
        let s = self.keys.entry(key).or_default();
        if s.holder.as_ref().is_some_and(|(o, _)| o == owner) {
            s.holder = None;
        }
    }

    fn completed(&mut self, key: usize, owner: &str) {
        self.outcomes += 1;
        let s = self.keys.entry(key).or_default();
        if !s.completed_by.is_empty() {
            self.violations.push(format!(
                "key {key}: a second outcome by {owner} after {:?}",
                s.completed_by
            ));
        }
        s.completed_by.push(owner.to_owned());
        if s.holder.as_ref().is_some_and(|(o, _)| o == owner) {
            s.holder = None;
        }
    }

    fn found(&mut self, key: usize, rec: &IdempotencyRecord) {
        let s = self.keys.entry(key).or_default();
        if rec.status == RecordStatus::Completed
            && !s.completed_by.contains(&rec.owner)
            && !s.completed_by.is_empty()
        {
            self.violations.push(format!(
                "key {key}: the completed record is not the acknowledged outcome"
            ));
        }
    }
}

async fn client(
    store: RedisIdempotencyStore,
    seed: u64,
    round: usize,
    checker: Arc<Mutex<Checker>>,
    until: Instant,
) {
    let mut rng = Rng::from_state(seed);
    let hash = Digest::of_bytes(b"payload");
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let key_no = round * KEYS + usize::try_from(rng.below(KEYS as u64)).unwrap_or(0);
        let key = format!("idemp:{{pay}}:-:g:k{key_no}");
        let owner = format!("c{seed}-{n}");
        let sent = Instant::now();
        let claim = store
            .claim(&key, IdempotencyRecord::pending(hash, &owner, LEASE), LEASE)
            .await;
        let acked = Instant::now();
        match claim {
            Ok(ClaimOutcome::Claimed | ClaimOutcome::TakenOver { .. }) => {
                checker.lock().unwrap().claimed(key_no, &owner, sent, acked);
                tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
                match rng.below(4) {
                    0 => {
                        // From the moment the release is sent, another client may claim
                        // (its answer can reach the checker before this one's).
                        checker.lock().unwrap().ended(key_no, &owner);
                        let _ = store.release(&key, &owner).await;
                    }
                    1 => {
                        // Walk away: the lease lapses and another client takes over.
                    }
                    _ => {
                        let done = IdempotencyRecord::completed(
                            hash,
                            &owner,
                            ToolResponse::new(json!({"by": owner})),
                            RECORD_TTL,
                        );
                        checker.lock().unwrap().ended(key_no, &owner);
                        if let Ok(true) = store.finish(&key, &owner, done, RECORD_TTL).await {
                            checker.lock().unwrap().completed(key_no, &owner);
                        }
                    }
                }
            }
            Ok(ClaimOutcome::Existing(rec)) => checker.lock().unwrap().found(key_no, &rec),
            Err(_) => {
                // Unknown: it may land later. Release by this claim's owner token, as the
                // layer does; the checker never counts it as held.
                let _ = store.release(&key, &owner).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_clients_never_hold_one_key_twice_through_pauses_and_restarts() {
    let Some(mut redis) = private_persistent_redis(
        "racing_clients_never_hold_one_key_twice_through_pauses_and_restarts",
    ) else {
        return;
    };
    let url = redis.url();
    let p = prefix();
    let checker = Arc::new(Mutex::new(Checker::default()));
    for round in 0..3 {
        let until = Instant::now() + Duration::from_millis(2_000);
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let store = RedisIdempotencyStore::new(connect(&url, &p, OP_TIMEOUT).await);
            let seed = 0x9E37_79B9_7F4A_7C15_u64
                .wrapping_mul(u64::try_from(c + 1 + round * CLIENTS).unwrap_or(1));
            tasks.push(tokio::spawn(client(
                store,
                seed,
                round,
                Arc::clone(&checker),
                until,
            )));
        }
        // Faults while the clients run: a pause, then a kill and restart.
        tokio::time::sleep(Duration::from_millis(400)).await;
        redis.pause();
        tokio::time::sleep(Duration::from_millis(250)).await;
        redis.resume();
        tokio::time::sleep(Duration::from_millis(500)).await;
        redis.kill();
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.restart().expect("restart");
        for t in tasks {
            t.await.expect("client task");
        }
    }
    let c = checker.lock().unwrap();
    assert!(c.violations.is_empty(), "{:#?}", c.violations);
    assert!(c.claims >= 10, "the clients raced: {} claims", c.claims);
    assert!(c.outcomes >= 3, "outcomes were recorded: {}", c.outcomes);
}
