//! `ShieldConfig`: loading, merging, environment overrides and every problem listed.

use std::time::Duration;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield_core::CallKind;

fn shipped() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/toolshield.example.toml")
}

#[test]
fn the_shipped_config_loads_and_merges_tools_over_defaults() {
    let text = std::fs::read_to_string(shipped()).unwrap();
    let cfg = ShieldConfig::from_toml_str(&text).unwrap();
    assert!(cfg.enabled);
    let weather = cfg.tool("weather");
    assert_eq!(weather.kind, Some(CallKind::ReadOnly));
    assert_eq!(weather.cache.ttl, Duration::from_secs(300));
    assert_eq!(weather.retry.max_attempts, 4);
    // untouched fields of a section come from the defaults, not from the layer's default
    assert_eq!(weather.retry.rate_limit_backoff, Duration::from_secs(30));
    assert_eq!(weather.timeout.attempt, Duration::from_secs(10));
    let search = cfg.tool("search");
    assert_eq!(search.timeout.attempt, Duration::from_secs(5));
    assert_eq!(
        search.timeout.soft,
        Some(Duration::from_secs(2)),
        "soft comes from defaults"
    );
    assert_eq!(search.timeout.total, Some(Duration::from_secs(30)));
    let pay = cfg.tool("pay");
    assert_eq!(pay.kind, Some(CallKind::Mutating));
    assert!(pay.schema.is_some());
    // a tool without a section gets the defaults
    assert_eq!(cfg.tool("unknown").timeout.attempt, Duration::from_secs(10));
}

#[test]
fn a_file_with_three_mistakes_lists_all_three_with_their_paths() {
    let text = r#"
        [defaults.retry]
        max_attempts = 0                       # mistake 1: zero attempts

        [tools.weather]
        kind = "read_only"
        timeout = { attempt = "5s", sfot = "1s" }   # mistake 2: unknown field

        [tools.pay]
        kind = "mutating"
        cache = { ttl = "5m" }                 # mistake 3: caching a mutation
    "#;
    let err = ShieldConfig::from_toml_str(text).unwrap_err();
    let fields: Vec<&str> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert!(fields.contains(&"defaults.retry.max_attempts"), "{err}");
    assert!(
        fields
            .iter()
            .any(|f| f.starts_with("tools.weather.timeout")),
        "{err}"
    );
    assert!(fields.contains(&"tools.pay.cache.ttl"), "{err}");
    let text = err.to_string();
    assert!(text.contains("sfot"), "{text}");
    assert!(text.contains("only read_only tools are cached"), "{text}");
}

#[test]
fn cross_layer_rules_are_checked() {
    let err = ShieldConfig::from_value(json!({
        "tools": {
            "slow": {
                "timeout": {"attempt": "20s", "total": "10s"},
                "breaker": {"window": {"type": "time", "duration": "30s", "buckets": 10}}
            },
            "bad_schema": {"schema": {"type": "not-a-type"}}
        }
    }))
    .unwrap_err();
    let fields: Vec<&str> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert!(fields.contains(&"tools.slow.timeout.attempt"), "{err}");
    assert!(
        fields.contains(&"tools.slow.breaker.window.duration"),
        "{err}"
    );
    assert!(fields.contains(&"tools.bad_schema.schema"), "{err}");
}

#[test]
fn environment_overrides_apply_by_path() {
    let text = std::fs::read_to_string(shipped()).unwrap();
    let value: serde_json::Value = toml::from_str(&text).unwrap();
    let cfg = ShieldConfig::from_value_with_env(
        value,
        [
            ("TOOLSHIELD_ENABLED", "false"),
            ("TOOLSHIELD_DEFAULTS__RETRY__MAX_ATTEMPTS", "5"),
            ("TOOLSHIELD_TOOLS__WEATHER__CACHE__TTL", "10m"),
            ("TOOLSHIELD_REDIS_URL", "redis://127.0.0.1:6379"), // not ours: ignored
            ("PATH", "/usr/bin"),
        ],
    )
    .unwrap();
    assert!(!cfg.enabled);
    assert_eq!(cfg.defaults.retry.max_attempts, 5);
    assert_eq!(
        cfg.tool("search").retry.max_attempts,
        5,
        "tools inherit the overridden default"
    );
    assert_eq!(
        cfg.tool("weather").retry.max_attempts,
        4,
        "a tool's own setting still wins"
    );
    assert_eq!(cfg.tool("weather").cache.ttl, Duration::from_secs(600));

    let err = ShieldConfig::from_value_with_env(
        json!({}),
        [("TOOLSHIELD_DEFAULTS__RETRY__MAX_ATTEMPTS", "lots")],
    )
    .unwrap_err();
    assert_eq!(
        err.problems()[0].field,
        "defaults.retry.max_attempts",
        "{err}"
    );
}

#[test]
fn json_works_too_and_unknown_sections_are_named() {
    let cfg =
        ShieldConfig::from_json_str(r#"{"tools": {"weather": {"kind": "read_only"}}}"#).unwrap();
    assert_eq!(cfg.tool("weather").kind, Some(CallKind::ReadOnly));
    let err =
        ShieldConfig::from_json_str(r#"{"tols": {}, "tools": {"w": {"retyr": {}}}}"#).unwrap_err();
    let fields: Vec<&str> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["tols", "tools.w.retyr"], "{err}");
    assert!(ShieldConfig::from_toml_str("enabled = [").is_err());
}

#[test]
fn blank_and_reserved_tool_names_are_rejected_when_loading() {
    let err =
        ShieldConfig::from_toml_str("[tools.\" \"]\n[tools.other]\n[tools.all]\n[tools.ok]\n")
            .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("must not be empty or blank"), "{text}");
    assert!(text.contains("tools.other: `other` is reserved"), "{text}");
    // The admin API's key for every breaker: a tool of that name could not be acted on
    // alone.
    assert!(text.contains("tools.all: `all` is reserved"), "{text}");
    assert_eq!(err.problems().len(), 3, "{text}");
}

#[test]
fn unbounded_durations_are_listed_with_their_paths_in_defaults_and_tools() {
    let text = r#"
        [defaults]
        timeout = { attempt = "300000000000years" }

        [tools.x]
        kind = "read_only"
        retry = { rate_limit_backoff = "300000000000years", max_attempts = 0 }
        cache = { ttl = "300000000000years" }
    "#;
    let err = ShieldConfig::from_toml_str(text).unwrap_err();
    let fields: Vec<&str> = err.problems().iter().map(|p| p.field.as_str()).collect();
    for expected in [
        "defaults.timeout.attempt",
        "tools.x.retry.rate_limit_backoff",
        "tools.x.retry.max_attempts",
        "tools.x.cache.ttl",
    ] {
        assert!(fields.contains(&expected), "{expected} missing from {err}");
    }
    for p in err.problems() {
        if p.field != "tools.x.retry.max_attempts" {
            assert!(
                p.message
                    .contains("longer than the longest duration accepted"),
                "{err}"
            );
        }
    }
    // The tool inherits the defaults' timeout: its problem is reported once.
    assert!(!fields.contains(&"tools.x.timeout.attempt"), "{err}");
}
