//! The fallback chain as a user relies on it: tiers tried in the order they were added,
//! each judged on the error of the one before, the escalation hook last; which errors a
//! read or a mutation may fall back on; and application code in the chain (a tier's
//! predicate) that panics.

use std::sync::{Arc, Mutex};

use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_fallback::{Escalation, FallbackLayer};
use tower::{service_fn, Layer, ServiceExt};

type Svc = tower::util::BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;
type Log = Arc<Mutex<Vec<&'static str>>>;

/// A service named `name` that writes its name to `log` and answers `result`.
fn step(log: &Log, name: &'static str, result: Result<(), ErrorKind>) -> Svc {
    let log = log.clone();
    Svc::new(service_fn(move |_req: ToolRequest| {
        log.lock().unwrap().push(name);
        async move {
            match result {
                Ok(()) => Ok(ToolResponse::new(json!(name))),
                Err(kind) => Err(ToolError::new(kind, format!("{name} failed"))),
            }
        }
    }))
}

fn seen(log: &Log) -> Vec<&'static str> {
    log.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn tiers_run_in_the_order_added_until_one_answers() {
    let log = Log::default();
    let layer = FallbackLayer::new()
        .tier(
            "simplified",
            step(&log, "simplified", Err(ErrorKind::Timeout)),
        )
        .tier("haiku", step(&log, "haiku", Ok(())))
        .tier("gpt-4o-mini", step(&log, "gpt-4o-mini", Ok(())))
        .escalate(|_failure| async { Escalation::Abort });
    let stats = layer.stats();
    let svc = layer.layer(step(&log, "sonnet", Err(ErrorKind::CircuitOpen)));
    let res = svc
        .oneshot(ToolRequest::new("llm", json!({})).kind(CallKind::ReadOnly))
        .await
        .unwrap();
    assert_eq!(res.output, json!("haiku"));
    assert_eq!(res.provenance.tier.as_deref(), Some("haiku"));
    assert_eq!(seen(&log), ["sonnet", "simplified", "haiku"]);
    let counts: Vec<u64> = stats.hand_overs().into_iter().map(|(_, n)| n).collect();
    assert_eq!(counts, [1, 1, 0]);
    assert_eq!((stats.exhausted(), stats.escalations()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn the_escalation_hook_is_asked_last_with_every_error_in_chain_order() {
    let log = Log::default();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let record = asked.clone();
    let hook_log = log.clone();
    let svc = FallbackLayer::new()
        .tier(
            "simplified",
            step(&log, "simplified", Err(ErrorKind::RateLimited)),
        )
        .tier(
            "haiku",
            step(&log, "haiku", Err(ErrorKind::UpstreamUnavailable)),
        )
        .escalate(move |failure| {
            hook_log.lock().unwrap().push("user");
            *record.lock().unwrap() = failure
                .errors
                .iter()
                .map(|(tier, e)| (tier.to_string(), e.kind()))
                .collect::<Vec<_>>();
            async { Escalation::Skip(ToolResponse::new(json!("the user decided"))) }
        })
        .layer(step(&log, "sonnet", Err(ErrorKind::CircuitOpen)));
    let res = svc
        .oneshot(ToolRequest::new("llm", json!({})).kind(CallKind::ReadOnly))
        .await
        .unwrap();
    assert_eq!(res.provenance.tier.as_deref(), Some("escalation"));
    assert_eq!(seen(&log), ["sonnet", "simplified", "haiku", "user"]);
    assert_eq!(
        *asked.lock().unwrap(),
        [
            ("primary".to_owned(), ErrorKind::CircuitOpen),
            ("simplified".to_owned(), ErrorKind::RateLimited),
            ("haiku".to_owned(), ErrorKind::UpstreamUnavailable),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn with_the_default_rule_each_call_kind_falls_back_on_exactly_the_documented_errors() {
    for call_kind in [CallKind::ReadOnly, CallKind::Idempotent, CallKind::Mutating] {
        for kind in ErrorKind::ALL {
            let log = Log::default();
            let svc = FallbackLayer::new()
                .tier("mirror", step(&log, "mirror", Ok(())))
                .layer(step(&log, "primary", Err(kind)));
            let result = svc
                .oneshot(ToolRequest::new("t", json!({})).kind(call_kind))
                .await;
            let expected = kind == ErrorKind::CircuitOpen
                || (kind.is_retriable() && call_kind != CallKind::Mutating);
            if expected {
                assert_eq!(
                    result.unwrap().provenance.tier.as_deref(),
                    Some("mirror"),
                    "{call_kind:?} {kind}"
                );
            } else {
                let err = result.expect_err("stays with the caller");
                assert_eq!(err.kind(), kind, "{call_kind:?}: returned as it was");
                assert_eq!(seen(&log), ["primary"], "{call_kind:?} {kind}");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_mutation_goes_no_further_than_the_first_tier_that_may_have_run_it() {
    for (call_kind, expected) in [
        (CallKind::Mutating, vec!["primary", "a", "b"]),
        (CallKind::ReadOnly, vec!["primary", "a", "b", "c"]),
    ] {
        let log = Log::default();
        let svc = FallbackLayer::new()
            .tier("a", step(&log, "a", Err(ErrorKind::CircuitOpen)))
            .tier("b", step(&log, "b", Err(ErrorKind::Timeout)))
            .tier("c", step(&log, "c", Ok(())))
            .layer(step(&log, "primary", Err(ErrorKind::CircuitOpen)));
        let result = svc
            .oneshot(ToolRequest::new("pay", json!({})).kind(call_kind))
            .await;
        assert_eq!(seen(&log), expected, "{call_kind:?}");
        if call_kind == CallKind::Mutating {
            let err = result.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Timeout, "the last tier that ran");
            for part in ["primary: CIRCUIT_OPEN", "a: CIRCUIT_OPEN", "b: TIMEOUT"] {
                assert!(err.message().contains(part), "{}", err.message());
            }
        } else {
            assert_eq!(result.unwrap().provenance.tier.as_deref(), Some("c"));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_tier_predicate_that_panics_ends_the_call_with_internal() {
    let log = Log::default();
    let svc = FallbackLayer::new()
        .tier_when(
            "mirror",
            step(&log, "mirror", Ok(())),
            |req: &ToolRequest, _e: &ToolError| {
                // Application code reading a field the payload lacks.
                req.payload()["region"]
                    .as_str()
                    .expect("a region")
                    .is_empty()
            },
        )
        .layer(step(&log, "primary", Err(ErrorKind::CircuitOpen)));
    let outcome = tokio::spawn(
        svc.oneshot(ToolRequest::new("t", json!({"city": "Oslo"})).kind(CallKind::ReadOnly)),
    )
    .await
    .expect("the panic does not unwind into the caller's task");
    let err = outcome.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(
        !err.message().contains("a region"),
        "the panic text is logged, never returned: {}",
        err.message()
    );
    assert_eq!(seen(&log), ["primary"]);
}
