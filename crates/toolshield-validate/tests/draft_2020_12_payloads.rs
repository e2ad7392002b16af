//! What a JSON Schema user expects of payload checks: draft 2020-12 as jsonschema
//! implements it, `INVALID_INPUT` listing the problems, no panic on any schema or payload,
//! and no payload value in a message.

use serde_json::{json, Value};
use toolshield_core::ErrorKind;
use toolshield_validate::Schema;

fn check(schema: Value, payload: Value) -> Result<(), String> {
    let schema = Schema::new(schema).map_err(|e| format!("schema: {e}"))?;
    schema.check("t", &payload).map_err(|e| {
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        e.message().to_owned()
    })
}

#[test]
fn draft_2020_12_keywords_apply_by_default() {
    let tuple = json!({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false});
    assert!(check(tuple.clone(), json!([1, "a"])).is_ok());
    assert!(check(tuple.clone(), json!([1, "a", 3])).is_err());
    assert!(check(tuple, json!(["a", 1])).is_err());
    let defs = json!({"$defs": {"pos": {"type": "integer", "minimum": 1}}, "properties": {"n": {"$ref": "#/$defs/pos"}}});
    assert!(check(defs.clone(), json!({"n": 2})).is_ok());
    assert!(check(defs, json!({"n": 0})).is_err());
    let dep = json!({"dependentRequired": {"card": ["cvv"]}});
    assert!(check(dep.clone(), json!({"card": 1, "cvv": 2})).is_ok());
    assert!(check(dep, json!({"card": 1})).is_err());
    let uneval = json!({"properties": {"a": {}}, "unevaluatedProperties": false});
    assert!(check(uneval, json!({"a": 1, "secret_b": 2})).is_err());
    let declared =
        json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"});
    assert!(check(declared, json!({})).is_ok());
    let draft7 = json!({"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]});
    assert!(check(draft7, json!([1])).is_err());
    let embedded = json!({
        "$id": "https://example.com/root.json",
        "$defs": {"s": {"$id": "s.json", "type": "string"}},
        "properties": {"x": {"$ref": "s.json"}}
    });
    assert!(check(embedded.clone(), json!({"x": "ok"})).is_ok());
    assert!(check(embedded, json!({"x": 1})).is_err());
}

#[test]
fn every_problem_of_a_payload_is_named_up_to_the_listed_bound_without_values() {
    let schema = json!({
        "type": "object",
        "required": ["amount", "currency", "card"],
        "properties": {
            "amount": {"type": "integer", "minimum": 1},
            "currency": {"enum": ["EUR", "USD"]},
            "card": {"type": "string", "pattern": "^[0-9]{16}$"},
            "note": {"const": "fixed"}
        },
        "additionalProperties": false
    });
    let payload = json!({
        "amount": -4111111111111111i64,
        "currency": "hunter2",
        "card": "sk-live-secret-token",
        "note": "password=swordfish",
        "api_key_sk_live": "x"
    });
    let message = check(schema, payload).expect_err("invalid");
    for part in ["/amount", "/currency", "/card", "/note", "additional"] {
        assert!(message.contains(part), "{part} not named: {message}");
    }
    for secret in ["4111", "hunter2", "sk-live", "swordfish", "api_key"] {
        assert!(!message.contains(secret), "{secret} leaked: {message}");
    }
}

#[test]
fn untrusted_schemas_and_odd_payloads_are_errors_never_panics() {
    let schemas = [
        json!({"type": 12}),
        json!({"multipleOf": 0}),
        json!({"multipleOf": 1e-320}),
        json!({"minLength": -1}),
        json!({"maxItems": 1e300}),
        json!({"pattern": "(?<=a)b("}),
        json!({"pattern": "^(a+)+$"}),
        json!({"$ref": "#/nowhere"}),
        json!({"$ref": "https://example.com/x.json"}),
        json!({"$ref": "file:///etc/passwd"}),
        json!({"$schema": "https://example.com/unknown-meta"}),
        json!({"$dynamicRef": "#meta"}),
        json!({"format": "email"}),
        json!({"enum": []}),
        json!({"required": [1, 2]}),
        json!({"properties": {"a": {"$ref": "#/properties/a"}}}),
        json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        json!(true),
        json!(false),
        json!(null),
        json!([]),
        json!("string"),
    ];
    let payloads = [
        json!(null),
        json!(1e308),
        json!(-1e308),
        json!(u64::MAX),
        json!(i64::MIN),
        json!("a".repeat(10_000)),
        json!({"a": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"}),
        json!([[], {}, [[]], "x"]),
    ];
    for schema in schemas {
        if let Ok(schema) = Schema::new(schema) {
            for payload in &payloads {
                if let Err(e) = schema.check("t", payload) {
                    assert_eq!(e.kind(), ErrorKind::InvalidInput);
                }
            }
        }
    }
}
