//! A keyed bulkhead under keys a caller chooses: a million distinct keys hold at most
//! `max_keys` compartments, a busy key keeps its limit however many keys pass (it is never
//! evicted and recreated with fresh slots), and keys are compared as the exact strings
//! they are: keys that differ only by case, Unicode normalisation, a separator, a NUL or
//! a trailing space are different compartments, and the same string is always the same
//! one. Paused clock.

mod support;

use support::settle;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;
use toolshield_bulkhead::{BulkheadLayer, ByCaller};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

type Svc = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// A tool that answers at once, except for the caller `hold`, which waits for the gate.
fn tool(gate: Arc<Semaphore>) -> Svc {
    BoxCloneService::new(service_fn(move |req: ToolRequest| {
        let gate = Arc::clone(&gate);
        async move {
            if req
                .meta()
                .caller_id
                .as_deref()
                .is_some_and(|c| c.starts_with("hold"))
            {
                if let Ok(p) = gate.acquire().await {
                    p.forget();
                }
            }
            Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
        }
    }))
}

fn req(caller: &str) -> ToolRequest {
    ToolRequest::new("search", json!({})).caller(caller)
}

#[tokio::test(start_paused = true)]
async fn a_million_keys_hold_at_most_max_keys_and_never_reset_a_busy_key() {
    const MAX_KEYS: usize = 1_000;
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).keyed(ByCaller, MAX_KEYS);
    let stats = layer.stats();
    let mut svc = layer.layer(tool(Arc::clone(&gate)));
    // A busy key: its one slot taken for the whole flood.
    let busy = tokio::spawn(svc.clone().oneshot(req("hold-busy")));
    settle().await;
    let mut most = 0;
    for n in 0..1_000_000u32 {
        let r = svc.ready().await.unwrap().call(req(&format!("k{n}"))).await;
        assert!(r.is_ok(), "key {n}: {r:?}");
        if n % 1_000 == 0 {
            most = most.max(stats.snapshot().keys);
            // The busy key still has no free slot: it was not evicted and made afresh.
            let again = svc.clone().oneshot(req("hold-busy")).await.unwrap_err();
            assert_eq!(again.kind(), ErrorKind::Overloaded, "after {n} keys");
        }
    }
    most = most.max(stats.snapshot().keys);
    assert!(most <= MAX_KEYS, "{most} keys held, bound {MAX_KEYS}");
    let s = stats.snapshot();
    assert_eq!((s.in_flight, s.queued), (1, 0), "{s:?}");
    gate.add_permits(1);
    assert!(busy.await.unwrap().is_ok());
    assert_eq!(stats.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn when_every_held_key_is_busy_a_new_key_is_refused_and_admitted_once_one_is_idle() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1)
        .with_queue(1, Duration::from_secs(5))
        .keyed(ByCaller, 3);
    let stats = layer.stats();
    let svc = layer.layer(tool(Arc::clone(&gate)));
    let holders: Vec<_> = (0..3)
        .map(|n| tokio::spawn(svc.clone().oneshot(req(&format!("hold{n}")))))
        .collect();
    settle().await;
    assert_eq!(stats.snapshot().keys, 3);
    let err = svc.clone().oneshot(req("newcomer")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert!(err.message().contains("too many keys"), "{err}");
    // One key becomes idle: the newcomer takes its place.
    gate.add_permits(1);
    settle().await;
    assert!(svc.clone().oneshot(req("newcomer")).await.is_ok());
    assert!(stats.snapshot().keys <= 3);
    gate.add_permits(2);
    for h in holders {
        assert!(h.await.unwrap().is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn keys_that_differ_only_by_case_normalisation_separators_or_nul_are_separate_compartments() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = BulkheadLayer::new(1).keyed(ByCaller, 100);
    let stats = layer.stats();
    let svc = layer.layer(tool(Arc::clone(&gate)));
    // Each is a distinct caller id; every one starts with "hold" so its call waits.
    let keys = [
        "hold-alice",
        "hold-Alice",
        "hold-ALICE",
        "hold-caf\u{e9}",   // NFC
        "hold-cafe\u{301}", // NFD
        "hold-a:b",
        "hold-a|b",
        "hold-a/b",
        "hold-a\u{0}b",
        "hold-a\u{0}",
        "hold-a",
        "hold-a ",
        "hold-\u{200b}a",
    ];
    let mut held = Vec::new();
    for k in keys {
        held.push(tokio::spawn(svc.clone().oneshot(req(k))));
        settle().await;
        assert_eq!(
            stats.snapshot().in_flight,
            held.len(),
            "{k:?} shares a compartment with an earlier key"
        );
    }
    // The same string again is the same compartment: full.
    for k in keys {
        let err = svc.clone().oneshot(req(k)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Overloaded, "{k:?}");
    }
    assert_eq!(stats.snapshot().keys, keys.len());
    gate.add_permits(keys.len());
    for h in held {
        assert!(h.await.unwrap().is_ok());
    }
}
