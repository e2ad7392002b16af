//! Behaviour of the fault-injection layer, on tokio's paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_chaos::{
    ChaosConfig, ChaosLayer, ChaosStats, ErrorFault, FaultKind, HangFault, InBandFault,
    LatencyFault,
};
use toolshield_contract::{ErrorKind, InBandFailure, ShieldResponse, ToolError};
use toolshield_core::{ToolRequest, ToolResponse};
use tower::{service_fn, Layer, Service, ServiceExt};

/// A tool that counts its calls and answers at once.
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

fn req() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Oslo"}))
}

fn on(seed: u64) -> ChaosConfig {
    ChaosConfig {
        enabled: true,
        seed: Some(seed),
        ..ChaosConfig::default()
    }
}

fn error(rate: f64, kind: ErrorKind) -> ErrorFault {
    ErrorFault {
        rate,
        kind,
        retry_after: None,
    }
}

/// The outcome of a call, as a short label.
fn label(out: &Result<ToolResponse, ToolError>) -> String {
    match out {
        // A `ToolResponse` carries an injected in-band failure as `isError`.
        Ok(res) if res.in_band_failure().is_some() => format!(
            "in_band:{}",
            res.in_band_failure().map_or("", |f| f.kind.code())
        ),
        Ok(res) => format!("ok:{}", res.output),
        Err(e) => format!("err:{}", e.code()),
    }
}

#[test]
fn nothing_is_injected_unless_enabled_with_a_rate() {
    assert!(ChaosLayer::from_config("t", &ChaosConfig::default())
        .unwrap()
        .is_none());
    assert!(
        ChaosLayer::from_config("t", &on(1)).unwrap().is_none(),
        "no rate"
    );
    let mut off = on(1);
    off.enabled = false;
    off.error = vec![error(0.5, ErrorKind::Timeout)];
    assert!(ChaosLayer::from_config("t", &off).unwrap().is_none());
    let mut active = off.clone();
    active.enabled = true;
    assert!(ChaosLayer::from_config("t", &active).unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_injects_the_same_faults() {
    let mut cfg = on(1234);
    cfg.error = vec![
        error(0.2, ErrorKind::UpstreamUnavailable),
        error(0.1, ErrorKind::RateLimited),
    ];
    cfg.in_band = Some(InBandFault {
        rate: 0.1,
        kind: ErrorKind::ExecutionFailed,
    });
    let run = |cfg: ChaosConfig| async move {
        let (_, tool) = counting();
        let svc = ChaosLayer::new("weather", &cfg).layer(tool);
        let mut out = Vec::new();
        for _ in 0..300 {
            out.push(label(&svc.clone().oneshot(req()).await));
        }
        out
    };
    let a = run(cfg.clone()).await;
    let b = run(cfg.clone()).await;
    assert_eq!(a, b, "same seed, same sequence");
    let mut other = cfg.clone();
    other.seed = Some(1235);
    let c = run(other).await;
    assert_ne!(a, c, "another seed, another sequence");
    assert!(a.iter().any(|o| o == "err:UPSTREAM_UNAVAILABLE"));
    assert!(a.iter().any(|o| o == "err:RATE_LIMITED"));
    assert!(a.iter().any(|o| o == "in_band:EXECUTION_FAILED"));
    assert!(a.iter().any(|o| o == "ok:\"real\""));
}

#[tokio::test(start_paused = true)]
async fn rates_are_kept_and_faults_counted() {
    let mut cfg = on(99);
    cfg.error = vec![error(0.3, ErrorKind::ConnectionFailed)];
    let layer = ChaosLayer::from_config("weather", &cfg).unwrap().unwrap();
    let (calls, tool) = counting();
    let svc = layer.layer(tool);
    let mut failed = 0;
    for _ in 0..10_000 {
        if svc.clone().oneshot(req()).await.is_err() {
            failed += 1;
        }
    }
    assert!(
        (2_800..=3_200).contains(&failed),
        "{failed} of 10000 failed at rate 0.3"
    );
    assert_eq!(layer.stats().injected(FaultKind::Error), failed as u64);
    assert_eq!(layer.stats().total(), failed as u64);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        10_000 - failed,
        "errors skip the tool"
    );
    assert!(layer.stats().enabled());
}

#[tokio::test(start_paused = true)]
async fn latency_delays_the_call_then_calls_the_tool() {
    let mut cfg = on(5);
    cfg.latency = Some(LatencyFault {
        rate: 1.0,
        delay: Duration::from_secs(2),
    });
    let layer = ChaosLayer::new("weather", &cfg);
    let (calls, tool) = counting();
    let svc = layer.layer(tool);
    let start = Instant::now();
    let call = tokio::spawn(svc.oneshot(req()));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(1_999)).await;
    tokio::task::yield_now().await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the tool is called after the delay"
    );
    let res = call.await.unwrap().unwrap();
    assert_eq!(res.output, json!("real"));
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.stats().injected(FaultKind::Latency), 1);
}

#[tokio::test(start_paused = true)]
async fn injected_errors_carry_their_kind_and_retry_after() {
    let mut cfg = on(5);
    cfg.error = vec![ErrorFault {
        rate: 1.0,
        kind: ErrorKind::RateLimited,
        retry_after: Some(Duration::from_secs(7)),
    }];
    let (calls, tool) = counting();
    let err = ChaosLayer::new("weather", &cfg)
        .layer(tool)
        .oneshot(req())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_hang_lasts_until_the_attempt_is_cancelled() {
    let mut cfg = on(5);
    cfg.hang = Some(HangFault { rate: 1.0 });
    let layer = ChaosLayer::new("weather", &cfg);
    let (calls, tool) = counting();
    let svc = layer.layer(tool);
    let token = CancellationToken::new();
    let call = tokio::spawn(svc.clone().oneshot(req().cancel_token(token.clone())));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(3_600)).await;
    tokio::task::yield_now().await;
    assert!(!call.is_finished(), "still hanging after an hour");
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Without a cancellation, only a timeout outside ends it.
    let timed = tokio::time::timeout(Duration::from_secs(30), svc.oneshot(req())).await;
    assert!(timed.is_err());
    assert_eq!(layer.stats().injected(FaultKind::Hang), 2);
}

/// A response that can carry an in-band failure.
#[derive(Debug)]
struct Reply(Option<ErrorKind>);

impl ShieldResponse for Reply {
    fn in_band_failure(&self) -> Option<InBandFailure> {
        self.0.map(|kind| InBandFailure {
            kind,
            retry_after: None,
        })
    }
    fn in_band_failure_response(kind: ErrorKind, _message: &str) -> Option<Self> {
        Some(Reply(Some(kind)))
    }
}

#[tokio::test(start_paused = true)]
async fn in_band_failures_use_the_response_type_or_fall_back_to_an_error() {
    let mut cfg = on(5);
    cfg.in_band = Some(InBandFault {
        rate: 1.0,
        kind: ErrorKind::UpstreamUnavailable,
    });
    let layer = ChaosLayer::new("weather", &cfg);
    let tool = service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(Reply(None)) });
    let res = layer.layer(tool).oneshot(req()).await.unwrap();
    assert_eq!(
        res.in_band_failure().map(|f| f.kind),
        Some(ErrorKind::UpstreamUnavailable)
    );

    // A type with no room for one gets an error of the kind.
    let tool = service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(String::new()) });
    let err = layer.layer(tool).oneshot(req()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(layer.stats().injected(FaultKind::InBand), 2);
}

#[test]
fn every_problem_is_listed() {
    let cfg: ChaosConfig = serde_json::from_str(
        r#"{
            "enabled": true,
            "latency": {"rate": 1.5, "delay": "0s"},
            "error": [{"rate": -0.1, "kind": "TIMEOUT"}, {"rate": 0.6, "kind": "NOT_FOUND"}],
            "hang": {"rate": 0.5},
            "in_band": {"rate": 2}
        }"#,
    )
    .unwrap();
    let err = cfg.validate().unwrap_err();
    assert_eq!(
        toolshield_test::problem_fields(&err),
        [
            "latency.rate",
            "latency.delay",
            "error[0].rate",
            "in_band.rate",
            "rates"
        ]
    );
    let ok: ChaosConfig = serde_json::from_str(
        r#"{"enabled": true, "error": {"rate": 0.7, "kind": "TIMEOUT"}, "in_band": {"rate": 0.3}}"#,
    )
    .unwrap();
    assert!(ok.validate().is_ok(), "0.7 + 0.3 adds up to 1");
    assert_eq!(ok.in_band.unwrap().kind, ErrorKind::ExecutionFailed);
    assert!(
        serde_json::from_str::<ChaosConfig>(r#"{"error": {"rate": 0.1, "kind": "NOPE"}}"#).is_err()
    );
    assert!(serde_json::from_str::<ChaosConfig>(r#"{"latncy": {}}"#).is_err());
}

#[test]
fn stats_of_a_tool_without_injection_read_disabled() {
    let stats = ChaosStats::disabled("search");
    assert!(!stats.enabled());
    assert_eq!(stats.total(), 0);
    assert_eq!(&**stats.tool(), "search");
}
