//! Contract tests for the core types.
use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;
use toolshield_core::{
    cache_key, payload_digest, CallKind, Classify, DefaultClassifier, ErrorKind, Outcome,
    ShieldResponse, ToolError, ToolRequest, ToolResponse, ToolResult, ToolStatus,
};

#[test]
fn cache_key_ignores_key_order_and_formatting() {
    let a = json!({"city": "Paris", "opts": {"units": "metric", "days": 3}, "list": [1, 2]});
    let b: serde_json::Value = serde_json::from_str(
        r#"{ "list":[1,2], "opts":{"days":3.0,"units":"metric"}, "city":"Paris" }"#,
    )
    .unwrap();
    assert_eq!(
        cache_key("weather", &a).unwrap(),
        cache_key("weather", &b).unwrap()
    );
    assert_eq!(payload_digest(&a).unwrap(), payload_digest(&b).unwrap());
}

#[test]
fn cache_key_changes_with_value_tool_and_array_order() {
    let base = cache_key("weather", &json!({"city": "Paris"})).unwrap();
    assert_ne!(
        base,
        cache_key("weather", &json!({"city": "Lyon"})).unwrap()
    );
    assert_ne!(
        base,
        cache_key("search", &json!({"city": "Paris"})).unwrap()
    );
    assert_ne!(
        cache_key("t", &json!([1, 2])).unwrap(),
        cache_key("t", &json!([2, 1])).unwrap()
    );
    let (tool, hex) = base.split_once(':').unwrap();
    assert_eq!(tool, "weather");
    assert_eq!(hex.len(), 64);
    assert!(hex
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
}

#[test]
fn canonical_form_follows_rfc_8785() {
    // RFC 8785 sorts keys by UTF-16 code units and writes numbers in ES6 form.
    let v = json!({"b": 1, "a": [true, null, 1e3], "\u{20ac}": "x", "\r": 0.5});
    assert_eq!(
        toolshield_core::canonical::canonical_json(&v).unwrap(),
        r#"{"\r":0.5,"a":[true,null,1000],"b":1,"€":"x"}"#
    );
}

#[test]
fn request_clones_share_the_digest_and_retries_renew_the_execution_id() {
    let mut req = ToolRequest::new("pay", json!({"amount": 10}));
    let clone = req.clone();
    assert_eq!(
        req.payload_digest().unwrap(),
        clone.payload_digest().unwrap()
    );
    assert_eq!(
        req.cache_key().unwrap(),
        cache_key("pay", &json!({"amount": 10})).unwrap()
    );

    let first_id = req.execution_id();
    let first_token = req.attempt_token().clone();
    first_token.cancel();
    req.begin_attempt(2);
    assert_eq!(req.attempt(), 2);
    assert_ne!(req.execution_id(), first_id);
    assert!(
        !req.attempt_token().is_cancelled(),
        "a retry gets a fresh attempt token"
    );
    assert!(
        !req.is_cancelled(),
        "cancelling an attempt never cancels the call"
    );
    req.call_token().cancel();
    assert!(
        req.attempt_token().is_cancelled(),
        "the attempt token is a child of the call token"
    );
}

#[test]
fn builder_sets_metadata_and_defaults_to_mutating() {
    let req = ToolRequest::new("weather", json!({}));
    assert_eq!(req.call_kind(), CallKind::Mutating);
    let req = req
        .kind(CallKind::ReadOnly)
        .caller("agent-7")
        .trace_id("t-1")
        .run_id("r-1")
        .idempotency_key("k-1");
    assert_eq!(req.call_kind(), CallKind::ReadOnly);
    assert_eq!(req.meta().caller_id.as_deref(), Some("agent-7"));
    assert_eq!(req.meta().trace_id.as_deref(), Some("t-1"));
    assert_eq!(req.meta().run_id.as_deref(), Some("r-1"));
    assert_eq!(req.get_idempotency_key(), Some("k-1"));
    // Debug output never shows the payload.
    let secret = ToolRequest::new("t", json!({"password": "hunter2"}));
    assert!(!format!("{secret:?}").contains("hunter2"));
}

#[tokio::test(start_paused = true)]
async fn set_deadline_keeps_the_earlier_one() {
    let now = tokio::time::Instant::now();
    let mut req = ToolRequest::new("t", json!(null)).deadline(now + Duration::from_secs(5));
    req.set_deadline(now + Duration::from_secs(10));
    assert_eq!(req.deadline_at(), Some(now + Duration::from_secs(5)));
    req.set_deadline(now + Duration::from_secs(1));
    assert_eq!(req.deadline_at(), Some(now + Duration::from_secs(1)));
    tokio::time::advance(Duration::from_millis(400)).await;
    assert_eq!(req.remaining(), Some(Duration::from_millis(600)));
}

#[test]
fn every_error_kind_has_a_stable_unique_code_and_model_text() {
    let mut codes = HashSet::new();
    for kind in ErrorKind::ALL {
        let code = kind.code();
        assert!(codes.insert(code), "duplicate code {code}");
        assert!(
            code.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
            "{code}"
        );
        assert_eq!(ErrorKind::from_code(code), Some(kind));
        // serde uses the same code
        assert_eq!(serde_json::to_value(kind).unwrap(), json!(code));
        let text = ToolError::new(kind, "x").for_model("weather");
        assert!(!text.trim().is_empty(), "{code} has no model text");
        assert!(text.contains("weather"), "{code}: {text}");
    }
    assert_eq!(codes.len(), ErrorKind::ALL.len());
    assert_eq!(ErrorKind::RateLimited.code(), "RATE_LIMITED");
    assert_eq!(
        ErrorKind::IdempotencyKeyReused.code(),
        "IDEMPOTENCY_KEY_REUSED"
    );
}

#[test]
fn for_model_gives_actionable_advice() {
    assert!(ToolError::rate_limited("slow down", None)
        .for_model("w")
        .contains("Wait"));
    assert!(
        ToolError::rate_limited("slow down", Some(Duration::from_secs(7)))
            .for_model("w")
            .contains("7 seconds")
    );
    assert!(ToolError::invalid_input("bad")
        .for_model("w")
        .contains("Fix the arguments"));
    assert!(ToolError::new(ErrorKind::CircuitOpen, "open")
        .for_model("w")
        .contains("another"));
    // the raw message (possibly upstream details) never leaks into the model text
    assert!(!ToolError::execution_failed("db password wrong")
        .for_model("w")
        .contains("password"));
}

#[test]
fn retry_and_breaker_rules_per_kind() {
    use ErrorKind::*;
    for k in [Timeout, RateLimited, ConnectionFailed, UpstreamUnavailable] {
        assert!(k.is_retriable(), "{k}");
    }
    for k in [
        InvalidInput,
        Unauthorized,
        NotFound,
        CircuitOpen,
        Cancelled,
        IdempotencyKeyReused,
        OutcomeUnknown,
        InProgress,
    ] {
        assert!(!k.is_retriable(), "{k}");
    }
    for k in [RateLimited, Unauthorized, Timeout, ExecutionFailed] {
        assert!(k.counts_for_breaker(), "{k}");
    }
    for k in [
        Cancelled,
        InvalidInput,
        NotFound,
        IdempotencyKeyReused,
        InProgress,
        CircuitOpen,
    ] {
        assert!(!k.counts_for_breaker(), "{k}");
    }
}

#[test]
fn conversions_keep_the_source() {
    use std::error::Error as _;
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    let e: ToolError = io.into();
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
    assert_eq!(e.source().unwrap().to_string(), "refused");
    let bad: Result<serde_json::Value, _> = serde_json::from_str("{");
    let e: ToolError = bad.unwrap_err().into();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.source().is_some());
}

#[test]
fn default_classifier() {
    let c = DefaultClassifier;
    let ok: Result<ToolResponse, ToolError> = Ok(ToolResponse::new(json!({"v": 1})));
    assert_eq!(c.classify(&ok), Outcome::Success);

    let mcp_err: Result<ToolResponse, ToolError> =
        Ok(ToolResponse::new(json!({"isError": true, "content": []})));
    let o = c.classify(&mcp_err);
    assert!(o.counts_as_failure());
    assert_eq!(o.kind(), Some(ErrorKind::ExecutionFailed));

    let cancelled: Result<ToolResponse, ToolError> = Err(ToolError::cancelled("stop"));
    assert_eq!(c.classify(&cancelled), Outcome::Cancelled);
    assert!(!c.classify(&cancelled).counts_as_failure());

    let invalid: Result<ToolResponse, ToolError> = Err(ToolError::invalid_input("bad"));
    assert_eq!(c.classify(&invalid), Outcome::Ignored);

    let limited: Result<ToolResponse, ToolError> =
        Err(ToolError::rate_limited("429", Some(Duration::from_secs(7))));
    let o = c.classify(&limited);
    assert!(o.is_retriable() && o.counts_as_failure());
    assert_eq!(o.retry_after(), Some(Duration::from_secs(7)));

    // a closure is a classifier too
    let retry_everything = |r: &Result<ToolResponse, ToolError>| match r {
        Ok(_) => Outcome::Success,
        Err(e) => Outcome::Failure(toolshield_core::Failure {
            retriable: true,
            ..toolshield_core::Failure::of_kind(e.kind())
        }),
    };
    assert!(retry_everything.classify(&invalid).is_retriable());
}

#[test]
fn tool_result_json_has_exactly_the_envelope_fields() {
    let fields = |v: &serde_json::Value| {
        let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let expected = vec![
        "data",
        "durationMs",
        "error",
        "fromCache",
        "provenance",
        "status",
    ];

    let mut res = ToolResponse::new(json!({"temp": 21}));
    res.provenance.cache_hit = true;
    res.provenance.duration = Some(std::time::Duration::from_millis(12));
    let ok = serde_json::to_value(ToolResult::from(Ok::<_, ToolError>(res))).unwrap();
    assert_eq!(fields(&ok), expected);
    assert_eq!(ok["status"], "success");
    assert_eq!(ok["data"], json!({"temp": 21}));
    assert_eq!(ok["error"], json!(null));
    assert_eq!(ok["fromCache"], true);
    assert_eq!(ok["durationMs"], 12);
    assert_eq!(ok["provenance"]["cacheHit"], true);

    let err = ToolError::timeout("attempt timed out after 30s")
        .with_attempts(3)
        .with_elapsed(Duration::from_millis(1500));
    let e = serde_json::to_value(ToolResult::from(Err::<ToolResponse, _>(err))).unwrap();
    assert_eq!(fields(&e), expected);
    assert_eq!(e["status"], "timeout");
    assert_eq!(e["data"], json!(null));
    assert_eq!(
        e["error"],
        json!({"code": "TIMEOUT", "message": "attempt timed out after 30s", "retriable": true})
    );
    assert_eq!(e["durationMs"], 1500);
    assert_eq!(e["provenance"]["attempts"], 3);

    for (kind, status) in [
        (ErrorKind::CircuitOpen, ToolStatus::CircuitOpen),
        (ErrorKind::Cancelled, ToolStatus::Cancelled),
        (ErrorKind::NotFound, ToolStatus::Error),
    ] {
        assert_eq!(ToolResult::from(ToolError::new(kind, "x")).status, status);
    }
}

#[test]
fn slow_mark_is_visible_on_the_response() {
    let mut res = ToolResponse::new(json!(1));
    assert!(res.slow_call().is_none());
    res.mark_slow(toolshield_core::SlowCall {
        elapsed: Duration::from_secs(3),
        threshold: Duration::from_secs(2),
    });
    assert!(res.provenance.slow);
    assert_eq!(res.slow_call().unwrap().elapsed, Duration::from_secs(3));
}

#[test]
fn clones_given_their_own_call_token_do_not_share_an_attempt_token() {
    let parent = tokio_util::sync::CancellationToken::new();
    let template = ToolRequest::new("search", json!({"q": "x"})).cancel_token(parent.clone());
    let a = template.clone().cancel_token(parent.child_token());
    let b = template.clone().cancel_token(parent.child_token());
    // A timeout or a dropped future of `a` cancels its attempt token: `b`'s tool goes on.
    drop(a.call_tokens().clone().guard_attempt());
    assert!(a.attempt_token().is_cancelled());
    assert!(!b.attempt_token().is_cancelled());
    assert!(!b.is_cancelled());
    // The caller's own token still reaches both.
    parent.cancel();
    assert!(b.attempt_token().is_cancelled());
    assert!(b.is_cancelled());
}
