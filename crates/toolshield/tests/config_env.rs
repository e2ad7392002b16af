//! `TOOLSHIELD_*` overrides and JSON documents: tool names matched without regard to
//! case, schema keys kept as written, misspelt and unusable overrides listed as problems
//! at the variable's name, and a JSON tool given twice rejected.

use std::time::Duration;

use serde_json::json;
use toolshield::ShieldConfig;
use toolshield_core::{CallKind, ConfigError};
use toolshield_test::problem_fields;

fn message<'a>(err: &'a ConfigError, field: &str) -> &'a str {
    err.problems()
        .iter()
        .find(|p| p.field == field)
        .map(|p| p.message.as_str())
        .unwrap_or_else(|| panic!("no problem at {field}: {err}"))
}

#[test]
fn override_of_a_tool_matches_its_name_without_regard_to_case() {
    let doc = json!({"tools": {"GetWeather": {"kind": "read_only", "retry": {"max_attempts": 2}}}});
    let cfg = ShieldConfig::from_value_with_env(
        doc,
        [("TOOLSHIELD_TOOLS__GETWEATHER__RETRY__MAX_ATTEMPTS", "5")],
    )
    .unwrap();
    assert_eq!(
        cfg.tools.keys().collect::<Vec<_>>(),
        ["GetWeather"],
        "no second tool is created"
    );
    assert_eq!(cfg.tool("GetWeather").retry.max_attempts, 5);
    assert_eq!(cfg.tool("GetWeather").kind, Some(CallKind::ReadOnly));

    // Every part matches without regard to case.
    let cfg = ShieldConfig::from_value_with_env(
        json!({"tools": {"GetWeather": {"kind": "read_only"}}}),
        [
            ("TOOLSHIELD_Enabled", "false"),
            ("TOOLSHIELD_defaults__Retry__Max_Attempts", "4"),
            ("TOOLSHIELD_TOOLS__getWEATHER__Cache__TTL", "1m"),
        ],
    )
    .unwrap();
    assert!(!cfg.enabled);
    assert_eq!(cfg.defaults.retry.max_attempts, 4);
    assert_eq!(cfg.tools.len(), 1);
    assert_eq!(cfg.tool("GetWeather").cache.ttl, Duration::from_secs(60));
}

#[test]
fn override_naming_no_tool_is_a_problem_listed_with_the_others() {
    let err = ShieldConfig::from_value_with_env(
        json!({"tools": {"weather": {}}}),
        [
            ("TOOLSHIELD_TOOLS__WEATHR__CACHE__TTL", "10m"),
            ("TOOLSHIELD_DEFAULTS__RETRY__MAX_ATTEMPTS", "lots"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        problem_fields(&err),
        [
            "TOOLSHIELD_TOOLS__WEATHR__CACHE__TTL",
            "defaults.retry.max_attempts"
        ],
        "{err}"
    );
    assert!(
        message(&err, "TOOLSHIELD_TOOLS__WEATHR__CACHE__TTL").contains("no tool `WEATHR`"),
        "{err}"
    );
}

#[test]
fn override_of_a_name_two_tools_share_ignoring_case_is_a_problem() {
    let err = ShieldConfig::from_value_with_env(
        json!({"tools": {"Weather": {}, "weather": {}}}),
        [("TOOLSHIELD_TOOLS__WEATHER__KIND", "read_only")],
    )
    .unwrap_err();
    assert_eq!(
        problem_fields(&err),
        ["TOOLSHIELD_TOOLS__WEATHER__KIND"],
        "{err}"
    );
}

#[test]
fn override_inside_schema_is_a_problem() {
    let doc = json!({"tools": {"pay": {"schema": {"type": "object"}}}});
    let err = ShieldConfig::from_value_with_env(
        doc,
        [
            (
                "TOOLSHIELD_TOOLS__PAY__SCHEMA__ADDITIONALPROPERTIES",
                "false",
            ),
            ("TOOLSHIELD_DEFAULTS__SCHEMA__TYPE", "object"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        problem_fields(&err),
        [
            "TOOLSHIELD_DEFAULTS__SCHEMA__TYPE",
            "TOOLSHIELD_TOOLS__PAY__SCHEMA__ADDITIONALPROPERTIES"
        ],
        "{err}"
    );
    assert!(
        message(&err, "TOOLSHIELD_TOOLS__PAY__SCHEMA__ADDITIONALPROPERTIES")
            .contains("TOOLSHIELD_TOOLS__PAY__SCHEMA"),
        "the problem says how to set it: {err}"
    );

    // The way that works: the whole schema as JSON, its keys as written.
    let cfg = ShieldConfig::from_value_with_env(
        json!({"tools": {"pay": {"kind": "mutating"}}}),
        [(
            "TOOLSHIELD_TOOLS__PAY__SCHEMA",
            r#"{"type":"object","additionalProperties":false}"#,
        )],
    )
    .unwrap();
    assert_eq!(
        cfg.tool("pay").schema,
        Some(json!({"type": "object", "additionalProperties": false}))
    );
}

#[test]
fn misspelt_override_names_are_problems_other_readers_variables_are_not() {
    let err = ShieldConfig::from_value_with_env(
        json!({"tools": {"x": {}}}),
        [
            ("TOOLSHIELD_DEFAULT__RETRY__MAX_ATTEMPTS", "5"),
            ("TOOLSHIELD_TOOLS____X__KIND", "read_only"),
            ("TOOLSHIELD_ENABLE", "false"),
            ("TOOLSHIELD_DEFAULTS_RETRY_MAX_ATTEMPTS", "5"),
            ("TOOLSHIELD_DEFAULTS__RETRY__", "{}"),
            ("TOOLSHIELD_DEFAULTS__RETRI__MAX_ATTEMPTS", "5"),
            // Not configuration: left to their readers.
            ("TOOLSHIELD_REDIS_URL", "redis://127.0.0.1:6379"),
            ("TOOLSHIELD_URL", "http://127.0.0.1:8080"),
            ("TOOLSHIELD_ADMIN_TOKEN", "secret"),
            ("PATH", "/usr/bin"),
        ],
    )
    .unwrap_err();
    let mut got = problem_fields(&err);
    got.sort_unstable();
    assert_eq!(
        got,
        [
            "TOOLSHIELD_DEFAULTS_RETRY_MAX_ATTEMPTS",
            "TOOLSHIELD_DEFAULTS__RETRI__MAX_ATTEMPTS",
            "TOOLSHIELD_DEFAULTS__RETRY__",
            "TOOLSHIELD_DEFAULT__RETRY__MAX_ATTEMPTS",
            "TOOLSHIELD_ENABLE",
            "TOOLSHIELD_TOOLS____X__KIND",
        ],
        "{err}"
    );
    assert!(
        message(&err, "TOOLSHIELD_TOOLS____X__KIND").contains("empty"),
        "{err}"
    );
    assert!(
        message(&err, "TOOLSHIELD_DEFAULT__RETRY__MAX_ATTEMPTS").contains("`DEFAULT`"),
        "{err}"
    );
    assert!(!err.to_string().contains("secret"), "{err}");
}

#[test]
fn override_through_a_value_that_is_not_a_table_is_a_problem() {
    let err = ShieldConfig::from_value_with_env(
        json!({"defaults": {"kind": "read_only"}}),
        [
            ("TOOLSHIELD_ENABLED__NOW", "true"),
            ("TOOLSHIELD_DEFAULTS__KIND__READ", "true"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        problem_fields(&err),
        ["TOOLSHIELD_DEFAULTS__KIND__READ", "TOOLSHIELD_ENABLED__NOW"],
        "{err}"
    );
}

#[test]
fn two_variables_setting_one_key_in_different_case_are_a_problem() {
    let err = ShieldConfig::from_value_with_env(
        json!({"tools": {"weather": {}}}),
        [
            ("TOOLSHIELD_TOOLS__weather__KIND", "read_only"),
            ("TOOLSHIELD_TOOLS__WEATHER__KIND", "mutating"),
        ],
    )
    .unwrap_err();
    assert_eq!(err.problems().len(), 1, "{err}");
    assert!(
        problem_fields(&err)[0].starts_with("TOOLSHIELD_TOOLS__"),
        "{err}"
    );
}

#[test]
fn json_config_with_a_tool_twice_is_rejected() {
    let text =
        r#"{"tools": {"pay": {"kind": "mutating"}, "weather": {}, "pay": {"kind": "read_only"}}}"#;
    let err = ShieldConfig::from_json_str(text).unwrap_err();
    assert_eq!(problem_fields(&err), ["tools.pay"], "{err}");
    assert!(message(&err, "tools.pay").contains("`pay`"), "{err}");

    // The same key in two items of an array is not a duplicate.
    let cfg = ShieldConfig::from_json_str(
        r#"{"tools": {"pay": {"schema": {"allOf": [{"type": "object"}, {"type": "object"}]}}}}"#,
    )
    .unwrap();
    assert!(cfg.tool("pay").schema.is_some());

    // The same through a file, and for any key given twice.
    let dir = std::env::temp_dir().join(format!("toolshield-dup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("toolshield.json");
    std::fs::write(
        &path,
        r#"{"defaults": {"retry": {"max_attempts": 2, "max_attempts": 3}}, "tools": {"a": {}, "a": {}}}"#,
    )
    .unwrap();
    let err = ShieldConfig::load(&path).unwrap_err();
    std::fs::remove_dir_all(&dir).ok();
    let mut got = problem_fields(&err);
    got.sort_unstable();
    assert_eq!(got, ["defaults.retry.max_attempts", "tools.a"], "{err}");
}

#[test]
fn a_json_file_is_read_as_json_whatever_the_case_of_its_extension() {
    let dir = std::env::temp_dir().join(format!("toolshield-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("TOOLSHIELD.JSON");
    std::fs::write(&path, r#"{"tools": {"pay": {"kind": "mutating"}}}"#).unwrap();
    let cfg = ShieldConfig::load(&path);
    std::fs::remove_dir_all(&dir).ok();
    let cfg = cfg.unwrap_or_else(|e| panic!("read as TOML: {e}"));
    assert_eq!(cfg.tool("pay").kind, Some(CallKind::Mutating));
}

#[test]
fn an_override_of_a_tool_whose_name_holds_a_double_underscore_says_why_it_cannot() {
    let err = ShieldConfig::from_value_with_env(
        json!({"tools": {"srv__search": {"kind": "read_only"}}}),
        [("TOOLSHIELD_TOOLS__SRV__SEARCH__CACHE__TTL", "1m")],
    )
    .unwrap_err();
    let text = message(&err, "TOOLSHIELD_TOOLS__SRV__SEARCH__CACHE__TTL");
    assert!(text.contains("srv__search"), "{err}");
    assert!(text.contains("__"), "{err}");
}
