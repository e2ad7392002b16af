//! Single-flight: concurrent misses on one key run the tool once.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;
use toolshield_core::{ToolError, ToolResponse};

pub(crate) type Shared = Option<Result<ToolResponse, ToolError>>;

#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<HashMap<String, watch::Receiver<Shared>>>,
}

pub(crate) enum Join<'a> {
    /// Run the tool and hand the result to the followers.
    Lead(Leader<'a>),
    /// Wait for the leader's result.
    Follow(watch::Receiver<Shared>),
}

impl Flights {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, watch::Receiver<Shared>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn join<'a>(&'a self, key: &str) -> Join<'a> {
        let mut map = self.lock();
        if let Some(rx) = map.get(key) {
            return Join::Follow(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        map.insert(key.to_owned(), rx);
        Join::Lead(Leader {
            flights: self,
            key: key.to_owned(),
            tx: Some(tx),
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The leader's side of a flight. Dropped without [`finish`](Leader::finish) (the call was
/// cancelled), it ends the flight with no result: the followers wake and one of them
/// leads a new flight.
pub(crate) struct Leader<'a> {
    flights: &'a Flights,
    key: String,
    tx: Option<watch::Sender<Shared>>,
}

impl Leader<'_> {
    fn end(&mut self) -> Option<watch::Sender<Shared>> {
        let tx = self.tx.take()?;
        let mut map = self.flights.lock();
        if map
            .get(&self.key)
            .is_some_and(|rx| rx.same_channel(&tx.subscribe()))
        {
            map.remove(&self.key);
        }
        Some(tx)
    }

    /// Ends the flight and hands `result` to every follower.
    pub(crate) fn finish(mut self, result: &Result<ToolResponse, ToolError>) {
        if let Some(tx) = self.end() {
            // No follower left is fine.
            let _ = tx.send(Some(result.clone()));
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        // Dropping the sender wakes the followers with "closed".
        drop(self.end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_leader_leaves_no_flight_behind() {
        let flights = Flights::default();
        let Join::Lead(leader) = flights.join("k") else {
            panic!("the first caller leads");
        };
        let Join::Follow(rx) = flights.join("k") else {
            panic!("the second caller follows");
        };
        drop(leader);
        assert_eq!(flights.len(), 0, "the flight is gone");
        assert!(
            rx.has_changed().is_err(),
            "the follower sees the flight closed"
        );
        assert!(
            matches!(flights.join("k"), Join::Lead(_)),
            "the next caller leads"
        );
    }

    #[test]
    fn a_finished_leader_hands_its_result_to_followers() {
        let flights = Flights::default();
        let Join::Lead(leader) = flights.join("k") else {
            panic!("the first caller leads");
        };
        let Join::Follow(rx) = flights.join("k") else {
            panic!("the second caller follows");
        };
        leader.finish(&Ok(ToolResponse::new(serde_json::json!(1))));
        assert_eq!(flights.len(), 0);
        assert!(matches!(&*rx.borrow(), Some(Ok(r)) if r.output == serde_json::json!(1)));
    }
}
