//! What a schema error and a build error say: bounded, on one line, every problem listed.

use serde_json::{json, Value};
use toolshield_core::ErrorKind;
use toolshield_validate::Schema;

#[test]
fn a_schema_error_message_is_bounded_whatever_the_schema_quotes() {
    // `const` and `pattern` are quoted in their rule; a schema from a remote server may
    // make them as long as it likes, with newlines in them.
    let long = format!("line one\nline two {}", "x".repeat(100_000));
    let schema = Schema::new(json!({
        "type": "object",
        "properties": {
            "a": {"const": long},
            "b": {"type": "string", "pattern": format!("^{}$", "y".repeat(100_000))},
            "c": {"const": {"k": "z".repeat(100_000)}},
        }
    }))
    .unwrap();
    let tool = format!("evil\n{}", "t".repeat(10_000));
    let err = schema
        .check(&tool, &json!({"a": "secret-a", "b": "secret-b", "c": 1}))
        .expect_err("nothing matches");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let message = err.message();
    assert!(message.len() <= 4_096, "{} bytes", message.len());
    assert!(!message.chars().any(char::is_control), "{message:?}");
    assert!(!message.contains("secret"), "{message}");
    // Every error is still there, each cut.
    assert!(
        message.contains("/a:") && message.contains("/b:") && message.contains("/c:"),
        "{message}"
    );
}

#[test]
fn a_schema_that_does_not_compile_lists_every_problem() {
    let err = Schema::new(json!({
        "type": "objekt",
        "minimum": "x",
        "properties": {"a": {"type": 5}, "b": {"minLength": -1}}
    }))
    .expect_err("four problems");
    let problems = err.problems();
    let at = |place: &str| {
        problems
            .iter()
            .any(|p| p.message.contains(&format!("at {place}:")))
    };
    assert!(at("/type"), "{err}");
    assert!(at("/minimum"), "{err}");
    assert!(at("/properties/a/type"), "{err}");
    assert!(at("/properties/b/minLength"), "{err}");
    assert_eq!(problems.len(), 4, "{err}");
}

#[test]
fn a_schema_with_many_problems_lists_a_bounded_number() {
    let props: serde_json::Map<String, Value> = (0..10_000)
        .map(|i| (format!("p{i}"), json!({"type": 5})))
        .collect();
    let err = Schema::new(json!({"properties": props})).expect_err("10,000 problems");
    let problems = err.problems();
    assert!(problems.len() <= 25, "{} problems", problems.len());
    assert!(
        problems.iter().any(|p| p.message.contains("more")),
        "the rest is counted: {err}"
    );
}

#[test]
fn a_problem_that_only_the_build_finds_is_still_reported() {
    // Valid against the meta-schema; the reference goes nowhere.
    let err = Schema::new(json!({"$ref": "#/$defs/missing"})).expect_err("dangling ref");
    assert_eq!(err.problems().len(), 1, "{err}");
    assert!(err.to_string().contains("invalid schema"), "{err}");
    // And beside a meta-schema problem, both are listed.
    let err =
        Schema::new(json!({"type": "objekt", "properties": {"a": {"$ref": "#/$defs/missing"}}}))
            .expect_err("two problems");
    assert!(err.to_string().contains("at /type:"), "{err}");
}
