//! Failures a service reports inside a successful response (an MCP result with
//! `isError`, an HTTP 503) are outcomes the chain handles like errors of their kind.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield_core::{
    CallKind, ErrorKind, InBandFailure, ShieldResponse, ToolError, ToolRequest, ToolResponse,
};
use toolshield_fallback::FallbackLayer;
use tower::{service_fn, Layer, ServiceExt};

/// A response that may carry a failure in-band, as an HTTP response with a status does.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    body: &'static str,
    failure: Option<ErrorKind>,
    tier: Option<String>,
}

impl ShieldResponse for Answer {
    fn in_band_failure(&self) -> Option<InBandFailure> {
        self.failure.map(|kind| InBandFailure {
            kind,
            retry_after: None,
        })
    }

    fn mark_tier(&mut self, tier: &Arc<str>) {
        self.tier = Some(tier.to_string());
    }
}

type Svc = tower::util::BoxCloneSyncService<ToolRequest, Answer, ToolError>;

fn answering(calls: &Arc<AtomicU32>, body: &'static str, failure: Option<ErrorKind>) -> Svc {
    let calls = calls.clone();
    Svc::new(service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, ToolError>(Answer {
                body,
                failure,
                tier: None,
            })
        }
    }))
}

fn counters<const N: usize>() -> [Arc<AtomicU32>; N] {
    std::array::from_fn(|_| Arc::new(AtomicU32::new(0)))
}

fn read() -> ToolRequest {
    ToolRequest::new("search", json!({"q": "x"})).kind(CallKind::ReadOnly)
}

#[tokio::test]
async fn a_retriable_in_band_failure_of_the_primary_hands_over_to_the_next_tier() {
    let [p, m] = counters();
    let svc = FallbackLayer::<ToolRequest, Answer>::new()
        .tier("mirror", answering(&m, "mirror", None))
        .layer(answering(
            &p,
            "503 from the primary",
            Some(ErrorKind::UpstreamUnavailable),
        ));
    let res = svc.oneshot(read()).await.unwrap();
    assert_eq!(res.body, "mirror");
    assert_eq!(res.tier.as_deref(), Some("mirror"));
    assert_eq!((p.load(Ordering::SeqCst), m.load(Ordering::SeqCst)), (1, 1));
}

#[tokio::test]
async fn an_in_band_failure_no_tier_takes_goes_back_as_the_response_it_was() {
    let [p, m] = counters();
    // NOT_FOUND is not handed over by the default rule.
    let svc = FallbackLayer::<ToolRequest, Answer>::new()
        .tier("mirror", answering(&m, "mirror", None))
        .layer(answering(
            &p,
            "404 from the primary",
            Some(ErrorKind::NotFound),
        ));
    let res = svc.oneshot(read()).await.unwrap();
    assert_eq!(res.body, "404 from the primary");
    assert_eq!(res.failure, Some(ErrorKind::NotFound));
    assert_eq!(res.tier, None);
    assert_eq!(m.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_tier_predicate_sees_an_mcp_is_error_result_as_execution_failed() {
    let [p, m] = counters();
    let primary = {
        let p = p.clone();
        service_fn(move |_req: ToolRequest| {
            p.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, ToolError>(ToolResponse::new(json!({
                    "isError": true,
                    "content": [{"type": "text", "text": "quota exceeded"}],
                })))
            }
        })
    };
    let mirror = {
        let m = m.clone();
        service_fn(move |_req: ToolRequest| {
            m.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ToolError>(ToolResponse::new(json!("from the mirror"))) }
        })
    };
    let svc = FallbackLayer::new()
        .tier_when("mirror", mirror, |_req: &ToolRequest, e: &ToolError| {
            e.kind() == ErrorKind::ExecutionFailed
        })
        .layer(primary);
    let res = svc.oneshot(read()).await.unwrap();
    assert_eq!(res.output, json!("from the mirror"));
    assert_eq!(res.provenance.tier.as_deref(), Some("mirror"));
    assert_eq!((p.load(Ordering::SeqCst), m.load(Ordering::SeqCst)), (1, 1));
}

#[tokio::test]
async fn when_every_tier_answers_an_in_band_failure_the_error_lists_each_of_them() {
    let [p, m, s] = counters();
    let svc = FallbackLayer::<ToolRequest, Answer>::new()
        .tier(
            "mirror",
            answering(
                &m,
                "503 from the mirror",
                Some(ErrorKind::UpstreamUnavailable),
            ),
        )
        .tier(
            "snapshot",
            answering(&s, "429 from the snapshot", Some(ErrorKind::RateLimited)),
        )
        .layer(answering(
            &p,
            "503 from the primary",
            Some(ErrorKind::UpstreamUnavailable),
        ));
    let err = svc.oneshot(read()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    let message = err.to_string();
    for tier in ["primary", "mirror", "snapshot"] {
        assert!(message.contains(tier), "{tier} missing from {message}");
    }
    assert_eq!(
        (
            p.load(Ordering::SeqCst),
            m.load(Ordering::SeqCst),
            s.load(Ordering::SeqCst)
        ),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn a_mutation_answered_with_an_in_band_failure_is_not_sent_to_another_tier() {
    let [p, m] = counters();
    let svc = FallbackLayer::<ToolRequest, Answer>::new()
        .tier("mirror", answering(&m, "mirror", None))
        .layer(answering(
            &p,
            "503 from the primary",
            Some(ErrorKind::UpstreamUnavailable),
        ));
    let req = ToolRequest::new("pay", json!({"amount": 1})).kind(CallKind::Mutating);
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.body, "503 from the primary");
    assert_eq!(m.load(Ordering::SeqCst), 0);
}
