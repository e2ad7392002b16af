//! An injected delay is bounded by the call: a cancellation or the request's deadline ends
//! it (Simmy's latency strategy honours the cancellation token), on tokio's paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_chaos::{ChaosConfig, ChaosLayer, FaultKind, LatencyFault};
use toolshield_contract::{ErrorKind, ToolError};
use toolshield_core::{ToolRequest, ToolResponse};
use tower::{service_fn, Layer, Service, ServiceExt};

fn counting() -> (
    Arc<AtomicUsize>,
    impl Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future = impl Send> + Clone,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let svc = service_fn(move |_req: ToolRequest| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, ToolError>(ToolResponse::new(json!("real"))) }
    });
    (calls, svc)
}

fn slow(delay: Duration) -> ChaosLayer {
    ChaosLayer::new(
        "weather",
        &ChaosConfig {
            enabled: true,
            seed: Some(3),
            latency: Some(LatencyFault { rate: 1.0, delay }),
            ..ChaosConfig::default()
        },
    )
}

fn req() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Oslo"}))
}

#[tokio::test(start_paused = true)]
async fn an_injected_delay_ends_when_the_call_is_cancelled() {
    let layer = slow(Duration::from_secs(3_600));
    let (calls, tool) = counting();
    let token = CancellationToken::new();
    let start = Instant::now();
    let call = tokio::spawn(layer.layer(tool).oneshot(req().cancel_token(token.clone())));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(!call.is_finished());
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(1),
        "no wait after the cancel"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a cancelled call never reaches the tool"
    );
    assert_eq!(layer.stats().injected(FaultKind::Latency), 1);
}

#[tokio::test(start_paused = true)]
async fn an_injected_delay_on_a_cancelled_call_does_not_wait() {
    let layer = slow(Duration::from_secs(10));
    let (calls, tool) = counting();
    let token = CancellationToken::new();
    token.cancel();
    let start = Instant::now();
    let err = layer
        .layer(tool)
        .oneshot(req().cancel_token(token))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn an_injected_delay_does_not_outlive_the_deadline() {
    let layer = slow(Duration::from_secs(3_600));
    let (calls, tool) = counting();
    let start = Instant::now();
    let err = layer
        .layer(tool)
        .oneshot(req().deadline(start + Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "ended at the deadline"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the tool is not called past its deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn an_injected_delay_shorter_than_the_deadline_still_calls_the_tool() {
    let layer = slow(Duration::from_secs(1));
    let (calls, tool) = counting();
    let start = Instant::now();
    let res = layer
        .layer(tool)
        .oneshot(req().deadline(start + Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(res.output, json!("real"));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_huge_injected_delay_does_not_panic() {
    let layer = slow(Duration::MAX);
    let (_calls, tool) = counting();
    let out = tokio::time::timeout(Duration::from_secs(5), layer.layer(tool).oneshot(req())).await;
    assert!(out.is_err(), "still waiting, no panic");
}
