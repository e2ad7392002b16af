//! Injection rates at and beyond their bounds: 0 never injects, 1 always does, and a
//! rate outside 0..=1 given to the builder is clamped (never a panic), while
//! `validate` reports it.

use serde_json::json;
use toolshield_chaos::{ChaosConfig, ChaosLayer, ErrorFault, FaultKind};
use toolshield_contract::{ErrorKind, ToolError};
use toolshield_core::{ToolRequest, ToolResponse};
use tower::{service_fn, Layer, ServiceExt};

async fn injected(rate: f64, calls: u64) -> u64 {
    let cfg = ChaosConfig {
        enabled: true,
        seed: Some(11),
        error: vec![ErrorFault {
            rate,
            kind: ErrorKind::UpstreamUnavailable,
            retry_after: None,
        }],
        ..ChaosConfig::default()
    };
    let layer = ChaosLayer::new("t", &cfg);
    let svc = layer.layer(service_fn(|_req: ToolRequest| async {
        Ok::<_, ToolError>(ToolResponse::new(json!(1)))
    }));
    for _ in 0..calls {
        let _ = svc.clone().oneshot(ToolRequest::new("t", json!({}))).await;
    }
    layer.stats().injected(FaultKind::Error)
}

#[tokio::test(start_paused = true)]
async fn rate_zero_never_injects_and_rate_one_always_does() {
    assert_eq!(injected(0.0, 5_000).await, 0);
    assert_eq!(injected(1.0, 5_000).await, 5_000);
}

#[tokio::test(start_paused = true)]
async fn out_of_range_rates_are_clamped_by_the_builder_and_reported_by_validate() {
    assert_eq!(injected(7.5, 500).await, 500);
    assert_eq!(injected(f64::INFINITY, 500).await, 0);
    assert_eq!(injected(-2.0, 500).await, 0);
    assert_eq!(injected(f64::NAN, 500).await, 0);
    for rate in [7.5, -2.0, f64::NAN, f64::INFINITY] {
        let cfg = ChaosConfig {
            enabled: true,
            error: vec![ErrorFault {
                rate,
                kind: ErrorKind::Timeout,
                retry_after: None,
            }],
            ..ChaosConfig::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("error[0].rate"), "{rate}: {err}");
    }
}
