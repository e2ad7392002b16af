//! Single-flight: concurrent misses on one key run the tool once.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::Notify;
use toolshield_core::hash::FastHashMap;
use toolshield_core::{ErrorKind, ToolError, ToolResponse};

/// One flight: the leader's result (set only when someone follows), whether the leader
/// is done, and the followers' wake-up.
#[derive(Default)]
struct Flight {
    result: OnceLock<Result<ToolResponse, ToolError>>,
    ended: AtomicBool,
    done: Notify,
}

/// The calls in flight, by cache key.
#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<FastHashMap<Arc<str>, Arc<Flight>>>,
}

/// The outcome of [`Flights::join`].
pub(crate) enum Join<'a> {
    /// No flight for this key: the caller runs the tool and must finish the flight.
    Lead(Leader<'a>),
    /// A flight is running: wait for its result.
    Follow(Follower),
}

impl Flights {
    fn lock(&self) -> MutexGuard<'_, FastHashMap<Arc<str>, Arc<Flight>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the flight for `key`, or starts one.
    pub(crate) fn join<'a>(&'a self, key: &str) -> Join<'a> {
        let mut map = self.lock();
        if let Some(flight) = map.get(key) {
            return Join::Follow(Follower {
                flight: Arc::clone(flight),
            });
        }
        let flight = Arc::new(Flight::default());
        let key: Arc<str> = Arc::from(key);
        map.insert(Arc::clone(&key), Arc::clone(&flight));
        Join::Lead(Leader {
            flights: self,
            key,
            flight: Some(flight),
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A caller waiting for another caller's miss on the same key.
pub(crate) struct Follower {
    flight: Arc<Flight>,
}

impl Follower {
    /// The leader's result, or `None` when the leader ended without one (its call was
    /// dropped or cancelled): the caller looks again and may lead a new flight.
    pub(crate) async fn wait(self) -> Option<Result<ToolResponse, ToolError>> {
        loop {
            // Registered before the check, so a leader ending in between still wakes us.
            let mut notified = pin!(self.flight.done.notified());
            notified.as_mut().enable();
            if self.flight.ended.load(Ordering::Acquire) {
                return self.flight.result.get().cloned();
            }
            notified.await;
        }
    }
}

/// The leader's side of a flight. Dropped without [`finish`](Leader::finish) (the call was
/// dropped), or finished with `CANCELLED`, it ends the flight with no result: the
/// followers wake and one of them leads a new flight.
pub(crate) struct Leader<'a> {
    flights: &'a Flights,
    key: Arc<str>,
    flight: Option<Arc<Flight>>,
}

impl Leader<'_> {
    /// Removes this leader's flight from the map (not a later flight for the same key);
    /// from then on no caller can join it.
    fn end(&mut self) -> Option<Arc<Flight>> {
        let flight = self.flight.take()?;
        let mut map = self.flights.lock();
        if map.get(&self.key).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
            map.remove(&self.key);
        }
        Some(flight)
    }

    /// Hands the result to every follower and ends the flight; returns whether the result
    /// was copied for followers (with none, it is not).
    ///
    /// A `CANCELLED` result is the leader's own caller giving up (the tool honoured the
    /// attempt token, a child of that caller's token), not an answer for the followers,
    /// who did not cancel: it ends the flight without a result, as a dropped leader does.
    pub(crate) fn finish(mut self, result: &Result<ToolResponse, ToolError>) -> bool {
        if matches!(result, Err(e) if e.kind() == ErrorKind::Cancelled) {
            return false; // dropped here: no result
        }
        let Some(flight) = self.end() else {
            return false;
        };
        // The map's reference is gone: any other reference is a follower's.
        let copied = Arc::strong_count(&flight) > 1 && flight.result.set(result.clone()).is_ok();
        wake(&flight);
        copied
    }
}

fn wake(flight: &Flight) {
    flight.ended.store(true, Ordering::Release);
    flight.done.notify_waiters();
}

impl Drop for Leader<'_> {
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
        let Join::Lead(leader) = flights.join("k") else {
            panic!("the first caller leads");
        };
        let Join::Follow(follower) = flights.join("k") else {
            panic!("the second caller follows");
        };
        drop(leader);
        assert_eq!(flights.len(), 0, "the flight is gone");
        assert!(
            follower.wait().await.is_none(),
            "the follower sees the flight end without a result"
        );
        assert!(
            matches!(flights.join("k"), Join::Lead(_)),
            "the next caller leads"
        );
    }

    #[tokio::test]
    async fn a_finished_leader_hands_its_result_to_followers() {
        let flights = Flights::default();
        let Join::Lead(leader) = flights.join("k") else {
            panic!("the first caller leads");
        };
        let Join::Follow(follower) = flights.join("k") else {
            panic!("the second caller follows");
        };
        let waiting = tokio::spawn(follower.wait());
        tokio::task::yield_now().await;
        leader.finish(&Ok(ToolResponse::new(serde_json::json!(1))));
        assert_eq!(flights.len(), 0);
        let got = waiting.await.expect("follower task");
        assert!(matches!(got, Some(Ok(r)) if r.output == serde_json::json!(1)));
    }

    #[tokio::test]
    async fn a_cancelled_leader_hands_nothing_over() {
        let flights = Flights::default();
        let Join::Lead(leader) = flights.join("k") else {
            panic!("the first caller leads");
        };
        let Join::Follow(follower) = flights.join("k") else {
            panic!("the second caller follows");
        };
        assert!(!leader.finish(&Err(ToolError::cancelled("the caller gave up"))));
        assert_eq!(flights.len(), 0, "the flight is gone");
        assert!(
            follower.wait().await.is_none(),
            "the follower gets no result, not the leader's CANCELLED"
        );
        assert!(matches!(flights.join("k"), Join::Lead(_)));
    }

    #[test]
    fn a_leader_copies_its_result_only_for_followers() {
        let flights = Flights::default();
        let ok = Ok(ToolResponse::new(serde_json::json!(1)));
        let Join::Lead(alone) = flights.join("k") else {
            panic!("the first caller leads");
        };
        assert!(!alone.finish(&ok), "no follower: nothing copied");

        let Join::Lead(leader) = flights.join("k") else {
            panic!("the next caller leads a new flight");
        };
        let Join::Follow(_follower) = flights.join("k") else {
            panic!("the second caller follows");
        };
        assert!(leader.finish(&ok), "a follower: the result is handed over");
    }
}
