//! The whole default stack composed by hand: `ServiceBuilderExt` for the layers built
//! from arguments, `.layer(..)` for the ones built already.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield::breaker::{BreakerConfig, BreakerLayer};
use toolshield::cache::{CacheConfig, CacheLayer};
use toolshield::fallback::FallbackLayer;
use toolshield::idempotency::{IdempotencyConfig, IdempotencyLayer};
use toolshield::metrics::MetricsLayer;
use toolshield::prelude::*;
use toolshield::provenance::ProvenanceLayer;
use toolshield::validate::Schema;
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[tokio::test(start_paused = true)]
async fn every_layer_composes_in_the_default_order() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let tool = service_fn(move |req: ToolRequest| {
        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if n == 1 {
                Err(ToolError::new(ErrorKind::UpstreamUnavailable, "503"))
            } else {
                Ok(ToolResponse::new(json!({"city": req.payload()["city"]})))
            }
        }
    });
    let metrics = MetricsLayer::new(["weather"]).unwrap();
    let schema = Schema::new(json!({"type": "object", "required": ["city"]})).unwrap();
    let svc = ServiceBuilder::new()
        .layer(metrics.clone())
        .layer(ProvenanceLayer::new())
        .cancellable()
        .total_deadline(Duration::from_secs(30))
        .validated(schema)
        .layer(CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(60))).unwrap())
        .layer(IdempotencyLayer::new(IdempotencyConfig::default()).unwrap())
        .layer(FallbackLayer::new())
        .retries(3)
        .attempt_metrics(&metrics)
        .layer(BreakerLayer::from_config(&BreakerConfig::default()).unwrap())
        .attempt_timeout(Duration::from_secs(5), Some(Duration::from_secs(2)))
        .service(tool);

    let req = || ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly);
    let first = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(first.provenance.attempts, 2, "the 503 was retried");
    assert!(
        first.provenance.response_digest.is_some(),
        "provenance stamped the digest"
    );
    let second = svc.clone().oneshot(req()).await.unwrap();
    assert!(second.provenance.cache_hit);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let invalid = svc
        .oneshot(ToolRequest::new("weather", json!({})).kind(CallKind::ReadOnly))
        .await
        .unwrap_err();
    assert_eq!(invalid.kind(), ErrorKind::InvalidInput);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
