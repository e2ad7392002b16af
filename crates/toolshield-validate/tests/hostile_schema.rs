//! A schema from an untrusted source (a remote MCP server) and a payload built in code
//! cannot hang, panic, overflow the stack or fetch anything.

use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use toolshield_core::ErrorKind;
use toolshield_validate::{Schema, MAX_DEPTH};

/// `depth` levels of `wrap` around `leaf`, each level moved into the next (`json!` would
/// serialise, and so recurse through, its argument).
fn nested(depth: usize, leaf: Value, wrap: impl Fn(Value) -> Value) -> Value {
    let mut v = leaf;
    for _ in 0..depth {
        v = wrap(v);
    }
    v
}

fn object(key: &str, value: Value) -> Value {
    let mut map = Map::new();
    map.insert(key.to_owned(), value);
    Value::Object(map)
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

/// Runs `f` on a thread with an ordinary 2 MiB stack, as a tokio worker has.
fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_schema_nested_too_deep_is_a_config_error_not_a_crash() {
    on_small_stack(|| {
        let schema = nested(20_000, json!({"type": "integer"}), |v| {
            object("properties", object("a", v))
        });
        // Consumed and dropped by `new` without recursing.
        let err = Schema::new(schema).expect_err("too deep to compile");
        assert!(err.to_string().contains("deeper than"), "{err}");
        // A schema as deep as a parsed one can be compiles.
        let fits = nested(MAX_DEPTH / 2 - 1, json!({"type": "integer"}), |v| {
            object("properties", object("a", v))
        });
        assert!(Schema::new(fits).is_ok());
    });
}

#[test]
fn a_payload_nested_too_deep_is_invalid_input_not_a_crash() {
    on_small_stack(|| {
        let schema = Schema::new(json!({
            "$defs": {"n": {"type": ["object", "array", "integer"],
                            "properties": {"a": {"$ref": "#/$defs/n"}},
                            "items": {"$ref": "#/$defs/n"}}},
            "$ref": "#/$defs/n"
        }))
        .unwrap();
        let payload = nested(50_000, json!("secret-value"), |v| object("a", v));
        let err = schema.check("t", &payload).expect_err("too deep to check");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(!err.message().contains("secret-value"), "{}", err.message());
        drop_flat(payload);
        // As deep as a parsed payload can be: checked, the error found.
        let payload = nested(MAX_DEPTH - 1, json!("x"), |v| object("a", v));
        let err = schema
            .check("t", &payload)
            .expect_err("a string is not allowed");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(!err.message().contains("deeper"), "{}", err.message());
        let payload = nested(MAX_DEPTH - 1, json!(1), |v| Value::Array(vec![v]));
        assert!(schema.check("t", &payload).is_ok());
    });
}

#[test]
fn a_catastrophic_pattern_cannot_hold_a_call() {
    // Backtracking only runs for lookaround and backreferences; this one explodes.
    let schema = Schema::new(json!({
        "type": "array",
        "items": {"type": "string", "pattern": "^(a|a)*(?=b)$"}
    }))
    .unwrap();
    let payload = Value::Array(vec![json!("a".repeat(40)); 200]);
    let started = Instant::now();
    let err = schema.check("t", &payload).expect_err("no string matches");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    // With the engine's default limit this took over a second per string (a debug
    // build), minutes for the array.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(!err.message().contains("aaaa"), "{}", err.message());
}

#[test]
fn a_remote_or_file_ref_is_refused_without_fetching() {
    for target in ["http://127.0.0.1:9/schema.json", "file:///etc/passwd"] {
        let started = Instant::now();
        let err = Schema::new(json!({"$ref": target})).expect_err("nothing is fetched");
        assert!(err.to_string().contains("invalid schema"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn ref_loops_compile_and_check_without_hanging() {
    for schema in [
        json!({"$ref": "#"}),
        json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
               "$ref": "#/$defs/a"}),
    ] {
        if let Ok(schema) = Schema::new(schema) {
            let _ = schema.check("t", &json!({"x": [1, {"y": 2}]}));
        }
    }
}

#[test]
fn a_file_ref_is_refused_even_when_a_resolver_is_built_in() {
    // jsonschema's `resolve-file` is on in this test build, as feature unification turns
    // it on in any build where another crate takes jsonschema with its default features.
    let dir = std::env::temp_dir().join(format!("toolshield-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("schema.json");
    std::fs::write(&target, r#"{"type": "integer"}"#).unwrap();
    let uri = format!("file://{}", target.display());
    let result = Schema::new(json!({"$ref": uri}));
    let _ = std::fs::remove_dir_all(&dir);
    let err = result.expect_err("the file is not read");
    assert!(err.to_string().contains("invalid schema"), "{err}");
}
