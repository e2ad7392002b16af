//! What reaches a model, a log or a digest from hostile input: payload values never in
//! `Debug`, a tool's error message bounded and printable in the envelope, and a payload
//! too deep to canonicalise refused with `INVALID_INPUT`, never a crash.

use serde_json::{json, Value};
use toolshield_core::canonical::canonical_json;
use toolshield_core::{payload_digest, ErrorKind, ToolError, ToolRequest, ToolResult};

#[test]
fn shared_payload_debug_never_shows_payload_values() {
    let req = ToolRequest::new(
        "pay",
        json!({"card": "4111-1111-1111-1111", "api_key": "sk_live_secret"}),
    );
    let debug = format!("{:?}", req.shared_payload());
    assert!(!debug.contains("4111"), "{debug}");
    assert!(!debug.contains("sk_live_secret"), "{debug}");
    assert!(!debug.contains("api_key"), "{debug}");
    // The request's own Debug leaves the payload out too.
    let debug = format!("{req:?}");
    assert!(
        !debug.contains("4111") && !debug.contains("sk_live"),
        "{debug}"
    );
}

#[test]
fn a_hostile_error_message_is_bounded_and_printable_in_the_envelope() {
    let hostile = format!(
        "line one\nline two\r\n\u{1b}[31mred\u{7}\u{0}\u{2028}{}",
        "x".repeat(1_000_000)
    );
    let result = ToolResult::from(ToolError::execution_failed(hostile));
    let error = result.error.expect("an error envelope");
    let message = &error.message;
    assert!(
        message.len() <= toolshield_core::MAX_ENVELOPE_MESSAGE,
        "{} bytes",
        message.len()
    );
    assert!(
        !message
            .chars()
            .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}'),
        "{message:?}"
    );
    assert!(message.starts_with("line one line two"), "{message:?}");
    assert_eq!(error.code, "EXECUTION_FAILED");
    // A short, plain message is kept as it is.
    let plain = ToolResult::from(ToolError::timeout("attempt timed out after 30s"));
    assert_eq!(plain.error.unwrap().message, "attempt timed out after 30s");
    // A cut never splits a character.
    let wide = ToolResult::from(ToolError::execution_failed("é".repeat(10_000)));
    let message = wide.error.unwrap().message;
    assert!(message.len() <= toolshield_core::MAX_ENVELOPE_MESSAGE);
    assert!(message.starts_with("éé"));
}

/// `{"a": [{"a": [... 1 ...]}]}`, `depth` objects and arrays deep, built by moving each
/// level into the next (`json!` would serialise, and so recurse through, its argument).
fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for i in 0..depth {
        v = if i % 2 == 0 {
            Value::Array(vec![v])
        } else {
            let mut map = serde_json::Map::new();
            map.insert("a".to_owned(), v);
            Value::Object(map)
        };
    }
    v
}

/// Drops `value` level by level (dropping a `Value` recurses once per level).
fn drop_flat(value: Value) {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

#[test]
fn a_payload_nested_too_deep_for_a_canonical_form_is_invalid_input_not_a_crash() {
    // On a thread with an ordinary 2 MiB stack, as a tokio worker has.
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let deep = nested(200_000);
            let err = payload_digest(&deep).expect_err("no canonical form this deep");
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            assert!(err.message().len() < 200, "{}", err.message());
            let err = canonical_json(&deep).expect_err("no canonical form this deep");
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            let err = ToolRequest::new("t", Value::Null).payload_digest();
            assert!(err.is_ok());
            drop_flat(deep);
            // Anything serde_json parses (128 levels at most) has its digest.
            let parsed = nested(128);
            assert!(payload_digest(&parsed).is_ok());
            assert!(canonical_json(&parsed).is_ok());
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_serde_json_error_keeps_the_payload_values_out_of_the_message() {
    let payload = serde_json::json!("4111-1111-1111-1111");
    let err = serde_json::from_value::<u64>(payload).expect_err("a string is not a number");
    assert!(
        err.to_string().contains("4111"),
        "serde_json quotes the value: {err}"
    );
    let e = ToolError::from(err);
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(!e.message().contains("4111"), "{}", e.message());
    assert!(!e.to_string().contains("4111"), "{e}");
    // The source is kept for code that inspects it.
    assert!(std::error::Error::source(&e).is_some());
    // A syntax error keeps where it is.
    let syntax = serde_json::from_str::<serde_json::Value>("{\"card\": 4111x}").unwrap_err();
    let e = ToolError::from(syntax);
    assert!(!e.message().contains("4111"), "{}", e.message());
    assert!(e.message().contains("line 1"), "{}", e.message());
    // What was expected, and the caller's own field names, stay: a caller needs them to
    // correct its call.
    let e = ToolError::from(serde_json::from_value::<u64>(serde_json::json!("4111")).unwrap_err());
    assert!(e.message().contains("expected u64"), "{}", e.message());
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Lookup {
        city: String,
    }
    let missing = serde_json::from_value::<Lookup>(serde_json::json!({})).unwrap_err();
    assert!(ToolError::from(missing)
        .message()
        .contains("missing field `city`"));
    let unknown =
        serde_json::from_value::<Lookup>(serde_json::json!({"city": "x", "cty": 1})).unwrap_err();
    assert!(ToolError::from(unknown)
        .message()
        .contains("unknown field `cty`"));
}
