//! Behaviour of schema validation.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_validate::{Schemas, Unknown, ValidateLayer};
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
    let schemas = Schemas::builder()
        .tool("pay", pay_schema())
        .build()
        .unwrap();
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

#[tokio::test]
async fn tools_without_schema_pass_unless_rejected_by_config() {
    let tool =
        service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!(1))) });
    let allow = ValidateLayer::new(
        Schemas::builder()
            .tool("pay", pay_schema())
            .build()
            .unwrap(),
    )
    .layer(tool);
    assert!(allow
        .oneshot(ToolRequest::new("search", json!({"q": 1})))
        .await
        .is_ok());

    let strict = Schemas::builder()
        .tool("pay", pay_schema())
        .unknown_tools(Unknown::Reject)
        .build()
        .unwrap();
    let svc = ValidateLayer::new(strict).layer(tool);
    let err = svc
        .oneshot(ToolRequest::new("search", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.message().contains("no schema"));
}

#[test]
fn bad_schemas_are_all_listed_at_build_time() {
    let err = Schemas::builder()
        .tool("a", json!({"type": "no-such-type"}))
        .tool("b", json!({"type": "object"}))
        .tool("c", json!({"minimum": "one"}))
        .tool("b", json!({"type": "object"}))
        .build()
        .unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["tools.a.schema", "tools.c.schema", "tools.b.schema"],
        "{err}"
    );
}

#[test]
fn many_errors_are_capped_in_the_message() {
    let mut props = serde_json::Map::new();
    let mut payload = serde_json::Map::new();
    for i in 0..10 {
        props.insert(format!("f{i}"), json!({"type": "integer"}));
        payload.insert(format!("f{i}"), json!("x"));
    }
    let schemas = Schemas::builder()
        .tool("t", json!({"type": "object", "properties": props}))
        .build()
        .unwrap();
    let err = schemas
        .check("t", &serde_json::Value::Object(payload))
        .unwrap_err();
    assert!(err.message().contains("and 5 more"), "{}", err.message());
}
