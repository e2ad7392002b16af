//! Single-flight: concurrent misses on one key run the tool once.

use std::hash::BuildHasher;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use hashbrown::HashTable;
use tokio::sync::Notify;
use toolshield_core::hash::FastState;
use toolshield_core::{ErrorKind, ToolError, ToolResponse};

/// One flight: its key and the key's hash, the leader's caller, the leader's result (set
/// only when someone follows), whether the leader is done, and the followers' wake-up.
struct Flight {
    key: Box<str>,
    hash: u64,
    caller: Option<Arc<str>>,
    result: OnceLock<Handover>,
    ended: AtomicBool,
    done: Notify,
}

/// What a leader hands its followers: its answer, and whether the tool's failure behind
/// it (the error, or the one a stale entry answered) was its caller's own.
struct Handover {
    result: Result<ToolResponse, ToolError>,
    callers_own: bool,
}

/// The calls in flight, by cache key, over [`SHARDS`] locks (a miss takes one twice, and
/// every miss of every tool sharing a store would otherwise take the same one). The key
/// is hashed once per miss: the leader ends its flight by that hash and by identity,
/// without hashing or comparing the key again.
#[derive(Default)]
pub(crate) struct Flights {
    hasher: FastState,
    shards: [Shard; SHARDS],
}

/// The number of single-flight shards.
const SHARDS: usize = 16;

/// One lock's share of the flights, on a line of its own.
#[derive(Default)]
#[repr(align(128))]
struct Shard(Mutex<HashTable<Arc<Flight>>>);

/// Where a [`Leader`] finds the flight table it ends its flight in: borrowed from what the
/// caller owns (`&Flights`), or owned with the layer's state, for a leader made in `call`
/// and kept by its future.
pub(crate) trait FlightsRef {
    /// The table.
    fn flights(&self) -> &Flights;
}

impl FlightsRef for &Flights {
    fn flights(&self) -> &Flights {
        self
    }
}

/// The outcome of [`join`].
pub(crate) enum Join<R: FlightsRef> {
    /// No flight for this key: the caller runs the tool and must finish the flight.
    Lead(Leader<R>),
    /// A flight is running: wait for its result.
    Follow(Follower),
}

impl Flights {
    fn lock(&self, hash: u64) -> MutexGuard<'_, HashTable<Arc<Flight>>> {
        // Bits the table's buckets (low) and tags (top seven) do not use.
        let shard = &self.shards[(hash >> 32) as usize % SHARDS];
        shard.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the flight for `key` as a follower, or starts one (`Ok`, the new flight), for
    /// a call made by `caller`.
    fn enter(&self, key: &str, caller: Option<&Arc<str>>) -> Result<Arc<Flight>, Follower> {
        let hash = self.hasher.hash_one(key);
        let mut map = self.lock(hash);
        if let Some(flight) = map.find(hash, |f| *f.key == *key) {
            return Err(Follower {
                same_caller: flight.caller.as_deref() == caller.map(|c| &**c),
                flight: Arc::clone(flight),
            });
        }
        let flight = Arc::new(Flight {
            key: Box::from(key),
            hash,
            caller: caller.cloned(),
            result: OnceLock::new(),
            ended: AtomicBool::new(false),
            done: Notify::new(),
        });
        map.insert_unique(hash, Arc::clone(&flight), |f| f.hash);
        Ok(flight)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.0.lock().map_or(0, |m| m.len()))
            .sum()
    }
}

/// Joins the flight for `key` in the table `holder` leads to, or starts one, for a call
/// made by `caller`; a leader keeps `holder`.
pub(crate) fn join<R: FlightsRef>(holder: R, key: &str, caller: Option<&Arc<str>>) -> Join<R> {
    match holder.flights().enter(key, caller) {
        Ok(flight) => Join::Lead(Leader {
            flights: holder,
            flight: Some(flight),
        }),
        Err(follower) => Join::Follow(follower),
    }
}

/// A caller waiting for another caller's miss on the same key.
pub(crate) struct Follower {
    flight: Arc<Flight>,
    /// Whether the follower's caller is the leader's (both without one included).
    same_caller: bool,
}

impl Follower {
    /// The leader's result, or `None` when the leader ended without one (its call was
    /// dropped or cancelled), or with a refusal that was its caller's own: the caller
    /// looks again and may lead a new flight.
    ///
    /// `RATE_LIMITED`, `OVERLOADED` and `UNAUTHORIZED` answered to another caller are that
    /// caller's own when the rate limit or bulkhead inside is keyed by caller, or the
    /// tool is called with the caller's credentials: a follower with a quota, a
    /// compartment or credentials of its own inherits neither the refusal nor the stale
    /// entry the leader was answered with instead.
    pub(crate) async fn wait(self) -> Option<Result<ToolResponse, ToolError>> {
        loop {
            // Registered before the check, so a leader ending in between still wakes us.
            let mut notified = pin!(self.flight.done.notified());
            notified.as_mut().enable();
            if self.flight.ended.load(Ordering::Acquire) {
                return match self.flight.result.get() {
                    Some(h) if h.callers_own && !self.same_caller => None,
                    found => found.map(|h| h.result.clone()),
                };
            }
            notified.await;
        }
    }
}

/// Whether a refusal of this kind may be a caller's own (a limit keyed by caller, or the
/// caller's credentials refused).
pub(crate) fn callers_own(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::RateLimited | ErrorKind::Overloaded | ErrorKind::Unauthorized
    )
}

/// The leader's side of a flight. Dropped without [`finish`](Leader::finish) (the call was
/// dropped), or finished with `CANCELLED`, it ends the flight with no result: the
/// followers wake and one of them leads a new flight.
pub(crate) struct Leader<R: FlightsRef> {
    flights: R,
    flight: Option<Arc<Flight>>,
}

impl<R: FlightsRef> Leader<R> {
    /// What leads to the table (for a leader made in `call`, the layer's state).
    pub(crate) fn holder(&self) -> &R {
        &self.flights
    }

    /// Removes this leader's flight from the map (not a later flight for the same key);
    /// from then on no caller can join it.
    fn end(&mut self) -> Option<Arc<Flight>> {
        let flight = self.flight.take()?;
        let mut map = self.flights.flights().lock(flight.hash);
        if let Ok(found) = map.find_entry(flight.hash, |f| Arc::ptr_eq(f, &flight)) {
            found.remove();
        }
        Some(flight)
    }

    /// Hands a success to every follower, and to every caller that joins the flight from
    /// now on, while the leader still has work to do before it finishes (writing the
    /// result to a store with I/O): nobody waits for that write, and nobody calls the tool
    /// again before the entry is there. [`finish`](Self::finish) then ends the flight.
    pub(crate) fn publish(&self, response: &ToolResponse) {
        if let Some(flight) = &self.flight {
            let _ = flight.result.set(Handover {
                result: Ok(response.clone()),
                callers_own: false,
            });
            wake(flight);
        }
    }

    /// Hands the result to every follower and ends the flight; returns whether the result
    /// was copied for followers (with none, it is not). `callers_own` says the tool's
    /// failure behind `result` was the leader's caller's own ([`callers_own`]): only
    /// followers of the same caller take it.
    ///
    /// A `CANCELLED` result is the leader's own caller giving up (the tool honoured the
    /// attempt token, a child of that caller's token), not an answer for the followers,
    /// who did not cancel: it ends the flight without a result, as a dropped leader does.
    pub(crate) fn finish(
        mut self,
        result: &Result<ToolResponse, ToolError>,
        callers_own: bool,
    ) -> bool {
        if matches!(result, Err(e) if e.kind() == ErrorKind::Cancelled) {
            return false; // dropped here: no result
        }
        let Some(flight) = self.end() else {
            return false;
        };
        // The map's reference is gone: any other reference is a follower's.
        // Not copied again when `publish` handed it over already.
        let copied = Arc::strong_count(&flight) > 1
            && flight.result.get().is_none()
            && flight
                .result
                .set(Handover {
                    result: result.clone(),
                    callers_own,
                })
                .is_ok();
        wake(&flight);
        copied
    }
}

fn wake(flight: &Flight) {
    flight.ended.store(true, Ordering::Release);
    flight.done.notify_waiters();
}

impl<R: FlightsRef> Drop for Leader<R> {
    fn drop(&mut self) {
        // Ends the flight with no result: the followers look again.
        if let Some(flight) = self.end() {
            wake(&flight);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_leader_leaves_no_flight_behind() {
        let flights = Flights::default();
        let Join::Lead(leader) = join(&flights, "k", None) else {
            panic!("the first caller leads");
        };
        let Join::Follow(follower) = join(&flights, "k", None) else {
            panic!("the second caller follows");
        };
        drop(leader);
        assert_eq!(flights.len(), 0, "the flight is gone");
        assert!(
            follower.wait().await.is_none(),
            "the follower sees the flight end without a result"
        );
        assert!(
            matches!(join(&flights, "k", None), Join::Lead(_)),
            "the next caller leads"
        );
    }

    #[tokio::test]
    async fn a_finished_leader_hands_its_result_to_followers() {
        let flights = Flights::default();
        let Join::Lead(leader) = join(&flights, "k", None) else {
            panic!("the first caller leads");
        };
        let Join::Follow(follower) = join(&flights, "k", None) else {
            panic!("the second caller follows");
        };
        let waiting = tokio::spawn(follower.wait());
        tokio::task::yield_now().await;
        leader.finish(&Ok(ToolResponse::new(serde_json::json!(1))), false);
        assert_eq!(flights.len(), 0);
        let got = waiting.await.expect("follower task");
        assert!(matches!(got, Some(Ok(r)) if r.output == serde_json::json!(1)));
    }

    #[tokio::test]
    async fn a_cancelled_leader_hands_nothing_over() {
        let flights = Flights::default();
        let Join::Lead(leader) = join(&flights, "k", None) else {
            panic!("the first caller leads");
        };
        let Join::Follow(follower) = join(&flights, "k", None) else {
            panic!("the second caller follows");
        };
        assert!(!leader.finish(&Err(ToolError::cancelled("the caller gave up")), false));
        assert_eq!(flights.len(), 0, "the flight is gone");
        assert!(
            follower.wait().await.is_none(),
            "the follower gets no result, not the leader's CANCELLED"
        );
        assert!(matches!(join(&flights, "k", None), Join::Lead(_)));
    }

    #[test]
    fn a_leader_copies_its_result_only_for_followers() {
        let flights = Flights::default();
        let ok = Ok(ToolResponse::new(serde_json::json!(1)));
        let Join::Lead(alone) = join(&flights, "k", None) else {
            panic!("the first caller leads");
        };
        assert!(!alone.finish(&ok, false), "no follower: nothing copied");

        let Join::Lead(leader) = join(&flights, "k", None) else {
            panic!("the next caller leads a new flight");
        };
        let Join::Follow(_follower) = join(&flights, "k", None) else {
            panic!("the second caller follows");
        };
        assert!(
            leader.finish(&ok, false),
            "a follower: the result is handed over"
        );
    }

    #[test]
    fn a_leader_ends_only_its_own_flight() {
        let flights = Flights::default();
        let Join::Lead(first) = join(&flights, "cache:{a}:-:1", None) else {
            panic!("the first key's caller leads");
        };
        let Join::Lead(second) = join(&flights, "cache:{a}:-:2", None) else {
            panic!("another key has a flight of its own");
        };
        assert!(!first.finish(&Ok(ToolResponse::new(serde_json::json!(1))), false));
        assert_eq!(flights.len(), 1, "the other key's flight is still there");
        assert!(
            matches!(join(&flights, "cache:{a}:-:2", None), Join::Follow(_)),
            "a caller of the other key still follows its leader"
        );
        drop(second);
        assert_eq!(flights.len(), 0);
    }
}
