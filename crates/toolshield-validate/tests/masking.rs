//! Schema errors never echo payload keys or values, stop early on large payloads, and a
//! schema that does not compile is reported with the location of its problem.

use serde_json::{json, Value};
use toolshield_core::ErrorKind;
use toolshield_validate::Schema;

fn message_for(schema: Value, payload: &Value) -> String {
    let schemas = Schema::new(schema).unwrap();
    let err = schemas.check("t", payload).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    err.message().to_owned()
}

#[test]
fn property_names_errors_never_echo_the_key() {
    let msg = message_for(
        json!({"type": "object", "propertyNames": {"maxLength": 3}}),
        &json!({"sk_live_abcdef": 1}),
    );
    assert!(!msg.contains("sk_live"), "{msg}");
    assert!(msg.contains("propertyNames"), "{msg}");
}

#[test]
fn additional_and_unevaluated_properties_are_counted_not_listed() {
    let msg = message_for(
        json!({"type": "object", "properties": {"a": {}}, "additionalProperties": false}),
        &json!({"a": 1, "sk_live_one": 1, "sk_live_two": 2}),
    );
    assert!(!msg.contains("sk_live"), "{msg}");
    assert!(msg.contains("2 unexpected"), "{msg}");

    // The exact message for an email address used as a key.
    let msg = message_for(
        json!({"type": "object", "properties": {"amount": {}}, "additionalProperties": false}),
        &json!({"amount": 1, "alice@example.com": 1}),
    );
    assert_eq!(
        msg,
        "arguments for `t` do not match its schema: /: additional properties are not allowed (1 unexpected)"
    );
    // With no `properties`, the rule is checked per key: the key is a masked path.
    let msg = message_for(
        json!({"type": "object", "additionalProperties": false}),
        &json!({"alice@example.com": 1}),
    );
    assert!(!msg.contains("alice"), "{msg}");

    let msg = message_for(
        json!({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": false}),
        &json!({"a": 1, "sk_live_three": 3}),
    );
    assert!(!msg.contains("sk_live"), "{msg}");
}

#[test]
fn undeclared_keys_in_paths_are_masked_and_declared_ones_kept() {
    let msg = message_for(
        json!({
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"type": "object",
                "properties": {"amount": {"type": "integer"}}}}},
            "additionalProperties": {"type": "integer"}
        }),
        &json!({
            "sk_live_key": "secret_value",
            "items": [{"amount": "ten"}]
        }),
    );
    assert!(!msg.contains("sk_live"), "{msg}");
    assert!(!msg.contains("secret_value"), "{msg}");
    assert!(!msg.contains("ten"), "{msg}");
    assert!(msg.contains("/*: "), "{msg}");
    assert!(msg.contains("/items/0/amount: "), "{msg}");
}

#[test]
fn a_huge_invalid_array_stops_after_the_first_error() {
    let schema = json!({"type": "array", "items": {"type": "integer"}});
    let payload = Value::Array((0..300_000).map(|i| json!(format!("x{i}"))).collect());
    let schemas = Schema::new(schema).unwrap();
    let err = schemas.check("t", &payload).unwrap_err();
    let msg = err.message();
    assert!(
        msg.starts_with("arguments for `t` do not match its schema: /0: "),
        "{msg}"
    );
    assert!(msg.ends_with("further errors not checked"), "{msg}");
    assert!(!msg.contains("x0"), "{msg}");
    // The message says the walk stopped at the first error (walking all 300,000 took
    // about a second in a debug build); no timed assertion, which a loaded machine breaks.
}

#[test]
fn a_small_payload_lists_five_errors_and_counts_the_rest() {
    let schema = json!({"type": "array", "items": {"type": "integer"}});
    let payload = Value::Array((0..8).map(|i| json!(format!("x{i}"))).collect());
    let msg = message_for(schema, &payload);
    assert!(msg.contains("/4: "), "{msg}");
    assert!(!msg.contains("/5: "), "{msg}");
    assert!(msg.ends_with("; and 3 more"), "{msg}");
}

#[test]
fn a_schema_that_does_not_compile_names_the_location_of_the_problem() {
    let err = Schema::new(json!({"type": "object", "properties": {"amount": {"type": "integr"}}}))
        .unwrap_err()
        .prefixed("tools.pay.schema");
    let problem = &err.problems()[0];
    assert_eq!(problem.field, "tools.pay.schema");
    assert!(
        problem.message.contains("/properties/amount/type"),
        "{}",
        problem.message
    );
}
