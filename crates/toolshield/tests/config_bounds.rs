//! `ShieldConfig` against hostile or careless documents: every problem of a section is
//! listed (not only the first serde met), unknown fields are named with their path, and
//! the sizes of the per-key maps (rate-limit, bulkhead and breaker keys) are bounded.

use toolshield::config::{ShieldConfig, MAX_KEYS};

fn fields(err: &toolshield_core::ConfigError) -> Vec<String> {
    err.problems().iter().map(|p| p.field.clone()).collect()
}

#[test]
fn every_problem_of_one_section_is_listed_not_just_the_first() {
    let text = r#"
        [defaults.timeout]
        attempt = "soon"
        sfot = "1s"
        soft = 12

        [defaults.retry]
        max_attempts = "three"
        bogus = 1

        [tools.weather]
        kind = "read_only"
        timeout = { attempt = "x", hrad = "1s" }
    "#;
    let err = ShieldConfig::from_toml_str(text).unwrap_err();
    let fields = fields(&err);
    for want in [
        "defaults.timeout.attempt",
        "defaults.timeout.sfot",
        "defaults.timeout.soft",
        "defaults.retry.max_attempts",
        "defaults.retry.bogus",
        "tools.weather.timeout.attempt",
        "tools.weather.timeout.hrad",
    ] {
        assert!(fields.iter().any(|f| f == want), "{want} missing: {err}");
    }
    // Each problem once.
    let mut sorted = fields.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), fields.len(), "{err}");
}

#[test]
fn an_unknown_field_is_reported_at_its_own_path() {
    let text = r#"
        [defaults.retry.backoff]
        strategy = "exponential"
        bsae = "1s"
    "#;
    let err = ShieldConfig::from_toml_str(text).unwrap_err();
    let problem = err
        .problems()
        .iter()
        .find(|p| p.field == "defaults.retry.backoff.bsae")
        .unwrap_or_else(|| panic!("no problem at the unknown field's path: {err}"));
    assert!(problem.message.contains("unknown field"), "{err}");
}

#[test]
fn unbounded_key_maps_are_refused_with_every_path() {
    let huge = u64::MAX;
    let text = format!(
        r#"{{
            "defaults": {{
                "rate_limit": {{ "max_keys": {huge} }},
                "bulkhead": {{ "max_keys": {huge} }},
                "breaker": {{ "max_keys": {huge} }}
            }},
            "tools": {{ "search": {{ "rate_limit": {{ "key": "caller", "max_keys": {} }} }} }}
        }}"#,
        MAX_KEYS as u64 + 1
    );
    let err = ShieldConfig::from_json_str(&text).unwrap_err();
    let fields = fields(&err);
    for want in [
        "defaults.rate_limit.max_keys",
        "defaults.bulkhead.max_keys",
        "defaults.breaker.max_keys",
        "tools.search.rate_limit.max_keys",
    ] {
        assert!(fields.iter().any(|f| f == want), "{want} missing: {err}");
    }
    // The bound itself is accepted.
    let text = format!(
        r#"{{ "defaults": {{
            "rate_limit": {{ "max_keys": {MAX_KEYS} }},
            "bulkhead": {{ "max_keys": {MAX_KEYS} }},
            "breaker": {{ "max_keys": {MAX_KEYS} }} }} }}"#
    );
    ShieldConfig::from_json_str(&text).unwrap();
}

#[test]
fn validate_refuses_an_unbounded_key_map_built_in_code() {
    let mut cfg = ShieldConfig::default();
    cfg.defaults.breaker.max_keys = usize::MAX;
    let err = cfg.validate().unwrap_err();
    assert_eq!(fields(&err), ["defaults.breaker.max_keys"], "{err}");
}

#[test]
fn validate_refuses_tool_names_that_loading_refuses() {
    let mut cfg = ShieldConfig::default();
    cfg.tools.insert("other".to_owned(), Default::default());
    cfg.tools.insert(String::new(), Default::default());
    let err = cfg.validate().unwrap_err();
    assert_eq!(err.problems().len(), 2, "{err}");
}

#[test]
fn every_problem_inside_a_tagged_section_is_listed_at_its_field() {
    let text = r#"
        [defaults.retry.backoff]
        strategy = "fixed"
        min = "x"
        max = "y"
        q = 1

        [defaults.breaker.window]
        type = "time"
        duration = "x"
        buckets = "y"
    "#;
    let err = ShieldConfig::from_toml_str(text).unwrap_err();
    let mut got = fields(&err);
    got.sort();
    assert_eq!(
        got,
        [
            "defaults.breaker.window.buckets",
            "defaults.breaker.window.duration",
            "defaults.retry.backoff.max",
            "defaults.retry.backoff.min",
            "defaults.retry.backoff.q",
        ],
        "{err}"
    );
}
