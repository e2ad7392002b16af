//! Behaviour of schema validation.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_validate::{Schema, ValidateLayer};
use tower::{service_fn, Layer, ServiceExt};

fn pay_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "minimum": 1},
            "currency": {"enum": ["EUR", "USD"]},
            "card": {"type": "string", "pattern": "^[0-9]{16}$"}
        },
        "required": ["amount", "currency"],
        "additionalProperties": false
    })
}

#[tokio::test]
async fn invalid_payload_is_invalid_input_and_never_reaches_the_tool() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let tool = service_fn(move |_req: ToolRequest| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, ToolError>(ToolResponse::new(json!("paid"))) }
    });
    let schemas = Schema::new(pay_schema()).unwrap();
    let svc = ValidateLayer::new(schemas).layer(tool);

    let bad = json!({"amount": 0, "currency": "GBP", "card": "4111-secret-1111"});
    let err = svc
        .clone()
        .oneshot(ToolRequest::new("pay", bad))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(!err.is_retriable() && !err.counts_for_breaker());
    let msg = err.message();
    assert!(msg.contains("/amount"), "{msg}");
    assert!(msg.contains("/currency"), "{msg}");
    assert!(msg.contains("/card"), "{msg}");
    assert!(
        !msg.contains("4111-secret-1111"),
        "payload values must not leak: {msg}"
    );
    assert!(!msg.contains("GBP"), "payload values must not leak: {msg}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let missing = svc
        .clone()
        .oneshot(ToolRequest::new("pay", json!({})))
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::InvalidInput);
    assert!(
        missing.message().contains("amount"),
        "{}",
        missing.message()
    );

    let ok = svc
        .clone()
        .oneshot(ToolRequest::new(
            "pay",
            json!({"amount": 10, "currency": "EUR"}),
        ))
        .await
        .unwrap();
    assert_eq!(ok.output, json!("paid"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_bad_schema_is_a_config_error_at_build_time() {
    for bad in [json!({"type": "no-such-type"}), json!({"minimum": "one"})] {
        let err = Schema::new(bad).unwrap_err();
        assert_eq!(err.problems().len(), 1, "{err}");
        assert!(
            err.problems()[0].message.contains("invalid schema"),
            "{err}"
        );
        let prefixed = err.prefixed("tools.pay.schema");
        assert_eq!(prefixed.problems()[0].field, "tools.pay.schema");
    }
}

#[test]
fn many_errors_are_capped_in_the_message() {
    let mut props = serde_json::Map::new();
    let mut payload = serde_json::Map::new();
    for i in 0..10 {
        props.insert(format!("f{i}"), json!({"type": "integer"}));
        payload.insert(format!("f{i}"), json!("x"));
    }
    let schemas = Schema::new(json!({"type": "object", "properties": props})).unwrap();
    let err = schemas
        .check("t", &serde_json::Value::Object(payload))
        .unwrap_err();
    assert!(err.message().contains("and 5 more"), "{}", err.message());
}
