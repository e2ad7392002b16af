//! Which service each attempt calls: the caller's ready service for the first attempt, a
//! clone polled ready for every retry, and no clone at all for a call that succeeds first
//! time (tower's discipline of readiness before each call, without tower's clone per call).

mod common;

use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use common::read_request;
use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_retry::{BackoffStrategy, RetryLayer};
use tower::{Layer, Service, ServiceExt};

/// What every copy of a [`Counted`] service shares.
#[derive(Default)]
struct Log {
    clones: AtomicUsize,
    next_id: AtomicU32,
    /// (copy id, attempt) of every call, in order.
    calls: Mutex<Vec<(u32, u32)>>,
    /// How many attempts of each call fail (retriably) before one succeeds.
    failing_attempts: AtomicU32,
}

/// A tool that counts its clones, tells its copies apart, and is ready only once per
/// `poll_ready` (a call without readiness first fails the test).
struct Counted {
    id: u32,
    ready: bool,
    log: Arc<Log>,
}

impl Counted {
    fn new(failing_attempts: u32) -> (Self, Arc<Log>) {
        let log = Arc::new(Log::default());
        log.failing_attempts
            .store(failing_attempts, Ordering::SeqCst);
        let svc = Counted {
            id: 0,
            ready: false,
            log: Arc::clone(&log),
        };
        (svc, log)
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.log.clones.fetch_add(1, Ordering::SeqCst);
        Counted {
            id: self.log.next_id.fetch_add(1, Ordering::SeqCst) + 1,
            // A clone is not ready until polled, whatever the original was.
            ready: false,
            log: Arc::clone(&self.log),
        }
    }
}

impl Service<ToolRequest> for Counted {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        assert!(
            std::mem::take(&mut self.ready),
            "called copy {} without polling it ready",
            self.id
        );
        self.log
            .calls
            .lock()
            .unwrap()
            .push((self.id, req.attempt()));
        let fail = req.attempt() <= self.log.failing_attempts.load(Ordering::SeqCst);
        ready(if fail {
            Err(ToolError::new(ErrorKind::ConnectionFailed, "reset"))
        } else {
            Ok(ToolResponse::new(json!({"ok": true})))
        })
    }
}

fn no_wait() -> RetryLayer {
    RetryLayer::default().with_backoff(BackoffStrategy::none())
}

#[tokio::test(start_paused = true)]
async fn calls_that_succeed_first_time_clone_no_service_per_call() {
    let (tool, log) = Counted::new(0);
    let mut svc = no_wait().layer(tool);
    for _ in 0..5 {
        let res = svc.ready().await.unwrap().call(read_request()).await;
        assert!(res.is_ok());
    }
    // One clone kept for retries at the first call that could be retried; none per call
    // (tower's `Retry` clones the service on every call).
    assert_eq!(log.clones.load(Ordering::SeqCst), 1);
    // Every first attempt went to the caller's own ready service.
    assert!(log
        .calls
        .lock()
        .unwrap()
        .iter()
        .all(|&(id, a)| id == 0 && a == 1));
}

#[tokio::test(start_paused = true)]
async fn a_call_that_may_not_be_retried_keeps_no_clone() {
    let (tool, log) = Counted::new(0);
    let mut svc = no_wait().layer(tool);
    // A mutation without an idempotency key is never repeated.
    let req = ToolRequest::new("pay", json!({"amount": 1})).kind(CallKind::Mutating);
    svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(log.clones.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn each_retry_calls_a_fresh_clone_polled_ready_first() {
    let (tool, log) = Counted::new(2);
    let mut svc = no_wait().layer(tool);
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(read_request())
        .await
        .unwrap();
    assert_eq!(res.provenance.attempts, 3);
    let calls = log.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 3);
    // The first attempt on the caller's service, both retries on one clone of it (made
    // from the kept clone for this call), never on the caller's service again.
    assert_eq!(calls[0], (0, 1));
    assert_eq!(calls[1].1, 2);
    assert_eq!(calls[2].1, 3);
    assert_ne!(calls[1].0, 0);
    assert_eq!(calls[1].0, calls[2].0);
    // The kept clone, and one clone of it for this call's retries.
    assert_eq!(log.clones.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn concurrent_retried_calls_each_get_their_own_clone() {
    let (tool, log) = Counted::new(1);
    let svc = no_wait().layer(tool);
    let mut calls = Vec::new();
    for _ in 0..4 {
        let svc = svc.clone();
        calls.push(tokio::spawn(svc.oneshot(read_request())));
    }
    for call in calls {
        let res = call.await.unwrap().unwrap();
        assert_eq!(res.provenance.attempts, 2);
    }
    let calls = log.calls.lock().unwrap().clone();
    let retried: Vec<u32> = calls
        .iter()
        .filter(|&&(_, a)| a == 2)
        .map(|&(id, _)| id)
        .collect();
    assert_eq!(retried.len(), 4);
    let mut distinct = retried.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        4,
        "two calls retried on one copy: {calls:?}"
    );
}
