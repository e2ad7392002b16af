//! Keys too long to hold: a key longer than 4 KiB is never stored in the map of
//! compartments; every such key shares one overflow compartment, so the map's memory is
//! bounded by its key count times 4 KiB, and a long key is still limited.

mod support;

use support::settle;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;
use toolshield_bulkhead::{BulkheadLayer, ByCaller};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, Layer, ServiceExt};

fn req(caller: String) -> ToolRequest {
    ToolRequest::new("search", json!({})).caller(caller)
}

#[tokio::test(start_paused = true)]
async fn keys_longer_than_four_kib_share_one_overflow_compartment() {
    let layer = BulkheadLayer::new(1).keyed(ByCaller, 10_000);
    let stats = layer.stats();
    let gate = Arc::new(Semaphore::new(0));
    let tool = {
        let gate = Arc::clone(&gate);
        service_fn(move |_req: ToolRequest| {
            let gate = Arc::clone(&gate);
            async move {
                if let Ok(p) = gate.acquire().await {
                    p.forget();
                }
                Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
            }
        })
    };
    let svc = layer.layer(tool);

    // A key of ordinary length has a compartment of its own.
    let ordinary = tokio::spawn(svc.clone().oneshot(req("o".repeat(4096))));
    settle().await;
    assert_eq!(stats.snapshot().keys, 1);

    // Two different long keys share one compartment, which the map does not hold.
    let a = tokio::spawn(
        svc.clone()
            .oneshot(req(format!("a{}", "x".repeat(64 << 10)))),
    );
    settle().await;
    let other = svc
        .clone()
        .oneshot(req(format!("b{}", "x".repeat(64 << 10))));
    let err = tokio::time::timeout(Duration::from_secs(1), other)
        .await
        .expect("rejected at once, not admitted")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    let snap = stats.snapshot();
    assert_eq!((snap.keys, snap.in_flight), (1, 2));

    gate.add_permits(2);
    assert!(ordinary.await.unwrap().is_ok());
    assert!(a.await.unwrap().is_ok());
    assert_eq!(stats.snapshot().in_flight, 0);
}

#[test]
fn a_key_count_bound_above_max_keys_is_a_config_error() {
    // A bound of usize::MAX is no bound against a flood of distinct callers.
    use toolshield_bulkhead::BulkheadConfig;
    use toolshield_core::config::MAX_KEYS;
    for max_keys in [0, MAX_KEYS + 1, usize::MAX] {
        let cfg = BulkheadConfig {
            max_keys,
            ..BulkheadConfig::default()
        };
        let err = cfg.validate().expect_err("refused");
        assert_eq!(err.problems()[0].field, "max_keys", "{max_keys}: {err}");
    }
    let at_bound = BulkheadConfig {
        max_keys: MAX_KEYS,
        ..BulkheadConfig::default()
    };
    assert!(at_bound.validate().is_ok());
}
