//! Delays at their bounds never panic (`Instant + Duration` is checked): a huge delay
//! sends no hedge, a zero delay is clamped to the smallest one, and the configuration
//! refuses both.

use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield_contract::{CallKind, ToolError};
use toolshield_core::{ToolRequest, ToolResponse};
use toolshield_hedge::{DelayConfig, HedgeConfig, HedgeDelay, HedgeLayer, LatencyHistogram};
use tower::{service_fn, Layer, ServiceExt};

fn slow_tool(
) -> impl tower::Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future = impl Send>
       + Clone {
    service_fn(|_req: ToolRequest| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<_, ToolError>(ToolResponse::new(json!("ok")))
    })
}

#[tokio::test(start_paused = true)]
async fn huge_and_zero_delays_never_panic() {
    for delay in [
        HedgeDelay::fixed(Duration::MAX),
        HedgeDelay::percentile(95.0, Duration::MAX, Duration::MAX),
        HedgeDelay::percentile(f64::NAN, Duration::ZERO, Duration::ZERO),
        HedgeDelay::fixed(Duration::ZERO),
    ] {
        let layer = HedgeLayer::new(delay, u32::MAX);
        let stats = layer.stats().clone();
        let svc = layer.layer(slow_tool());
        let req = ToolRequest::new("t", json!({})).kind(CallKind::ReadOnly);
        let call = tokio::spawn(svc.oneshot(req));
        advance(Duration::from_secs(11)).await;
        assert!(call.await.unwrap().is_ok());
        assert!(stats.hedges_sent() <= 8, "max_hedges clamped");
    }
    let h = LatencyHistogram::new(50.0);
    for _ in 0..64 {
        h.record(Duration::MAX);
    }
    assert!(h.current().is_some());
}

#[test]
fn zero_and_unbounded_delays_are_config_errors() {
    for delay in [Duration::ZERO, Duration::MAX] {
        let cfg = HedgeConfig {
            enabled: true,
            delay: DelayConfig::Fixed(delay),
            max_hedges: 1,
        };
        assert!(cfg.validate().is_err(), "{delay:?}");
    }
}
