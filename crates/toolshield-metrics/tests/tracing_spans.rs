//! Spans and logs of a call: one `tool_execution` span with its fields, one child
//! `tool_attempt` span per attempt, and a secret in the payload or the output appears
//! nowhere in what is captured.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield_breaker::BreakerLayer;
use toolshield_cache::{CacheConfig, CacheLayer};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::{local_prometheus, MetricsConfig, MetricsLayer};
use toolshield_provenance::ProvenanceLayer;
use toolshield_retry::{BackoffStrategy, RetryLayer};
use toolshield_test::LogCapture;
use toolshield_timeout::TimeoutLayer;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tracing_subscriber::fmt::format::FmtSpan;

const SECRET: &str = "sk-live-51HZsecretTOKEN";

#[tokio::test(start_paused = true)]
async fn spans_have_the_fields_and_no_secret_leaks() {
    let capture = LogCapture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let exporter = local_prometheus();
    let metrics =
        MetricsLayer::build(MetricsConfig::with_tools(["payments"]), exporter.target()).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&calls);
    let tool = service_fn(move |req: ToolRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        // The tool sees the secret, and echoes it in its output.
        let card = req.payload()["card"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let refund = req.tool() == "refunds";
        async move {
            if refund {
                Err(ToolError::execution_failed("card declined"))
            } else if n == 0 {
                Err(ToolError::new(
                    ErrorKind::ConnectionFailed,
                    "connection reset",
                ))
            } else {
                Ok(ToolResponse::new(json!({"charged": true, "card": card})))
            }
        }
    });
    let mut svc = ServiceBuilder::new()
        .layer(metrics.clone())
        .layer(ProvenanceLayer::new())
        .layer(CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(60))).unwrap())
        .layer(
            RetryLayer::default()
                .with_backoff(BackoffStrategy::none())
                .without_budget(),
        )
        .layer(metrics.attempt_layer())
        .layer(BreakerLayer::new(Default::default()))
        .layer(TimeoutLayer::new(Duration::from_secs(5)))
        .service(tool);

    let req = ToolRequest::new("payments", json!({"card": SECRET, "amount": 42}))
        .kind(CallKind::ReadOnly)
        .trace_id("trace-7")
        .run_id("run-9")
        .idempotency_key("idem-1");
    let res = svc.ready().await.unwrap().call(req.clone()).await.unwrap();
    assert_eq!(res.output["card"], SECRET);
    assert_eq!(res.provenance.attempts, 2);
    // A cache hit: a second span, cache_hit=true.
    let hit = svc.ready().await.unwrap().call(req).await.unwrap();
    assert!(hit.provenance.cache_hit);
    // A failure, to capture the error path too.
    let bad = ToolRequest::new("refunds", json!({"card": SECRET}))
        .kind(CallKind::Idempotent)
        .trace_id("trace-8");
    let err = svc.ready().await.unwrap().call(bad).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed);
    // Debug formatting of the request, as a user might log it, hides the payload too.
    tracing::info!(request = ?ToolRequest::new("payments", json!({"card": SECRET})), "user log");

    let text = capture.text();
    assert!(!text.contains(SECRET), "secret leaked:\n{text}");
    assert!(!text.contains("sk-live"), "secret prefix leaked:\n{text}");

    let exec_close: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tool_execution{") && l.contains(": toolshield: close"))
        .filter(|l| !l.contains("tool_attempt{"))
        .collect();
    assert_eq!(
        exec_close.len(),
        3,
        "one tool_execution span per call:\n{text}"
    );
    let first = exec_close[0];
    for field in [
        "tool=\"payments\"",
        "trace_id=\"trace-7\"",
        "run_id=\"run-9\"",
        "attempts=2",
        "outcome=\"success\"",
        "cache_hit=false",
    ] {
        assert!(first.contains(field), "missing {field} in {first}");
    }
    assert!(
        exec_close[1].contains("cache_hit=true"),
        "{}",
        exec_close[1]
    );
    assert!(
        exec_close[1].contains("attempts=2"),
        "the hit keeps the original attempts: {}",
        exec_close[1]
    );

    let attempt_close: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tool_attempt{") && l.contains(": toolshield: close"))
        .collect();
    // Two attempts for the first call, none for the cache hit, one for the third call
    // (EXECUTION_FAILED is not retried).
    assert_eq!(attempt_close.len(), 3, "{text}");
    assert!(
        attempt_close[0].contains("tool_execution{")
            && attempt_close[0].contains("trace_id=\"trace-7\""),
        "attempt spans are children of the call span: {}",
        attempt_close[0]
    );
    assert!(
        attempt_close[0].contains("attempt=1")
            && attempt_close[0].contains("outcome=\"error\"")
            && attempt_close[0].contains("error_code=\"CONNECTION_FAILED\""),
        "{}",
        attempt_close[0]
    );
    assert!(
        attempt_close[1].contains("attempt=2") && attempt_close[1].contains("outcome=\"success\""),
        "{}",
        attempt_close[1]
    );
    let third = exec_close[2];
    for field in [
        "tool=\"refunds\"",
        "outcome=\"error\"",
        "error_code=\"EXECUTION_FAILED\"",
        "attempts=1",
    ] {
        assert!(third.contains(field), "missing {field} in {third}");
    }
    assert!(
        text.lines().any(
            |l| l.contains("tool call failed") && l.contains("error_code=\"EXECUTION_FAILED\"")
        ),
        "{text}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
