//! What the configuration documents promise: every problem listed with its path, nothing
//! panics on any input, and the documented defaults are the actual ones.

use std::time::Duration;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield_core::ConfigError;

fn fields(err: &ConfigError) -> Vec<String> {
    err.problems().iter().map(|p| p.field.clone()).collect()
}

fn has(err: &ConfigError, field: &str) -> bool {
    err.problems().iter().any(|p| p.field == field)
}

#[test]
fn one_file_with_a_mistake_of_every_sort_lists_each_at_its_path() {
    let err = ShieldConfig::from_toml_str(
        r#"
        colour = "blue"
        [defaults]
        retries = 3
        [defaults.timeout]
        attempt = "0s"
        [tools.a]
        kind = "sometimes"
        [tools.b]
        timeout = { attempt = "10s", soft = "20s" }
        [tools.c]
        timeout = { attempt = "10s", total = "5s" }
        [tools.d]
        retry = { max_attempts = "three" }
        [tools.e]
        timeout = { attempt = -5 }
        [tools.f]
        timeout = { attempt = "100000000000h" }
        [tools.g]
        layers = ["retry"]
        "#,
    )
    .expect_err("rejected");
    let text = err.to_string();
    for field in [
        "colour",
        "defaults.retries",
        "defaults.timeout.attempt",
        "tools.a.kind",
        "tools.d.retry.max_attempts",
        "tools.e.timeout.attempt",
        "tools.f.timeout.attempt",
        "tools.g.layers",
    ] {
        assert!(
            has(&err, field),
            "{field} missing in {:?}\n{text}",
            fields(&err)
        );
    }
    assert!(
        fields(&err)
            .iter()
            .any(|f| f.starts_with("tools.b.timeout")),
        "soft > attempt: {text}"
    );
    assert!(
        fields(&err)
            .iter()
            .any(|f| f.starts_with("tools.c.timeout")),
        "attempt > total: {text}"
    );
}

#[test]
fn a_soft_threshold_above_the_attempt_timeout_above_the_total_is_refused() {
    let err = ShieldConfig::from_value(json!({
        "defaults": {"timeout": {"attempt": "10s", "soft": "20s", "total": "5s"}}
    }))
    .expect_err("rejected");
    assert!(err.problems().len() >= 2, "{err}");
}

#[test]
fn arbitrary_bytes_and_deep_nesting_are_errors_never_panics() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in 0..400usize {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        let _ = ShieldConfig::from_toml_str(&text);
        let _ = ShieldConfig::from_json_str(&text);
    }
    for depth in [10usize, 100, 1_000, 20_000] {
        let arrays = format!("x = {}{}", "[".repeat(depth), "]".repeat(depth));
        let _ = ShieldConfig::from_toml_str(&arrays);
        let tables = format!("x = {}{}", "{a = ".repeat(depth), "}".repeat(depth));
        let _ = ShieldConfig::from_toml_str(&tables);
        let schema = format!(
            "[tools.t]\nkind = \"read_only\"\nschema = {}1{}",
            "{a = ".repeat(depth),
            "}".repeat(depth)
        );
        let _ = ShieldConfig::from_toml_str(&schema);
        let json = format!(
            "{{\"tools\": {{\"t\": {{\"schema\": {}1{}}}}}}}",
            "{\"a\": ".repeat(depth),
            "}".repeat(depth)
        );
        let _ = ShieldConfig::from_json_str(&json);
        let dotted = format!("{} = 1", vec!["a"; depth].join("."));
        let _ = ShieldConfig::from_toml_str(&dotted);
    }
}

#[test]
fn environment_values_of_every_shape_are_problems_never_panics() {
    let doc = json!({"tools": {"w": {"kind": "read_only"}}});
    let mut accepted = Vec::new();
    for (k, v) in [
        ("TOOLSHIELD_ENABLED", "maybe"),
        ("TOOLSHIELD___", "1"),
        ("TOOLSHIELD_DEFAULTS", "7"),
        ("TOOLSHIELD_TOOLS", "[]"),
        ("TOOLSHIELD_TOOLS__W", "1"),
        ("TOOLSHIELD_DEFAULTS__TIMEOUT__ATTEMPT", "-1"),
        ("TOOLSHIELD_DEFAULTS__TIMEOUT__ATTEMPT", "1e309"),
        (
            "TOOLSHIELD_DEFAULTS__RETRY__MAX_ATTEMPTS",
            "18446744073709551616",
        ),
        ("TOOLSHIELD_DEFAULTS__RETRY__MAX_ATTEMPTS", "-1"),
        ("TOOLSHIELD_DEFAULTS__TIMEOUT__ATTEMPT__X", "1s"),
    ] {
        let r = ShieldConfig::from_value_with_env(doc.clone(), [(k, v)]);
        if r.is_ok() {
            accepted.push(format!("{k}={v}"));
        }
    }
    assert!(accepted.is_empty(), "accepted: {accepted:?}");
}

#[test]
fn the_documented_defaults_are_the_actual_ones() {
    let cfg = ShieldConfig::default();
    assert!(cfg.enabled);
    let d = cfg.tool("anything");
    assert_eq!(d, &cfg.defaults);
    let t = serde_json::to_value(d).expect("serialises");
    assert_eq!(d.timeout.attempt, Duration::from_secs(30), "{t}");
    assert_eq!(d.timeout.soft, Some(Duration::from_secs(2)), "{t}");
    assert_eq!(d.timeout.total, None, "{t}");
    assert_eq!(d.retry.max_attempts, 3, "{t}");
    assert_eq!(d.cache.ttl, Duration::ZERO, "{t}");
    assert_eq!(
        format!("{:?}", d.retry.backoff),
        "Exponential { base: 500ms, factor: 2.0, cap: 5s, jitter: Full }"
    );
    assert_eq!(d.retry.rate_limit_backoff, Duration::from_secs(30));
    assert_eq!(d.retry.budget.ratio, 0.2);
    assert_eq!(d.retry.budget.min_per_sec, 10);
    let b = &d.breaker;
    assert_eq!(b.consecutive_failures, 5);
    assert_eq!(format!("{:?}", b.window), "Count { size: 100 }");
    assert_eq!(b.min_calls, 20);
    assert_eq!(b.failure_rate, 50.0);
    assert_eq!(b.slow_call_rate, Some(100.0));
    assert_eq!(b.open_wait, Duration::from_secs(30));
    assert_eq!((b.half_open_permits, b.half_open_successes), (1, 1));
    let i = &d.idempotency;
    assert_eq!(i.key_window, Duration::from_secs(3600));
    assert_eq!(i.record_ttl, Duration::from_secs(24 * 3600));
    assert_eq!(i.failed_ttl, Duration::from_secs(60));
    assert_eq!(i.lease, Duration::from_secs(30));
    assert_eq!(i.wait_timeout, Duration::from_secs(10));
    assert_eq!(format!("{:?}", i.on_pending), "Wait");
    assert_eq!(format!("{:?}", i.on_store_error), "FailClosed");
}

#[test]
fn a_tool_section_changes_only_what_it_names() {
    let cfg = ShieldConfig::from_toml_str(
        r#"
        [defaults]
        timeout = { attempt = "10s", soft = "1s", total = "60s" }
        retry = { max_attempts = 5 }
        [tools.w]
        kind = "read_only"
        timeout = { attempt = "4s" }
        "#,
    )
    .expect("valid");
    let w = cfg.tool("w");
    assert_eq!(w.timeout.attempt, Duration::from_secs(4));
    assert_eq!(w.timeout.soft, Some(Duration::from_secs(1)));
    assert_eq!(w.timeout.total, Some(Duration::from_secs(60)));
    assert_eq!(w.retry.max_attempts, 5);
    let other = cfg.tool("never_listed");
    assert_eq!(other.timeout.attempt, Duration::from_secs(10));
    assert_eq!(other.retry.max_attempts, 5);
}

#[test]
fn the_rollout_switch_is_read_from_the_environment() {
    let cfg = ShieldConfig::from_value_with_env(json!({}), [("TOOLSHIELD_ENABLED", "false")])
        .expect("valid");
    assert!(!cfg.enabled);
    let cfg = ShieldConfig::from_value_with_env(json!({}), [("TOOLSHIELD_ENABLED", "FALSE")]);
    assert!(
        cfg.as_ref().map_or(true, |c| !c.enabled),
        "FALSE must not leave the shield on: {cfg:?}"
    );
}

#[test]
fn a_configuration_written_out_as_json_reads_back_the_same() {
    let cfg = ShieldConfig::from_toml_str(
        r#"
        [defaults]
        timeout = { attempt = "10s", soft = "1s 500ms", total = "1m" }
        [tools.w]
        kind = "read_only"
        cache = { ttl = "5m", stale_if_error = "1h" }
        schema = { type = "object" }
        [tools.p]
        kind = "mutating"
        idempotency = { on_pending = "fail_fast" }
        "#,
    )
    .expect("valid");
    let mut written = cfg.clone();
    written.defaults.timeout.soft = None;
    for c in [cfg, written] {
        let text = serde_json::to_string(&c).expect("serialises");
        let back = ShieldConfig::from_json_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, c, "{text}");
    }
}

#[test]
fn a_configuration_built_in_code_with_extreme_values_is_refused_not_panicked_on() {
    let mut cases: Vec<ShieldConfig> = Vec::new();
    let base = ShieldConfig::default;
    let mut c = base();
    c.defaults.timeout.attempt = Duration::MAX;
    cases.push(c);
    let mut c = base();
    c.defaults.timeout.attempt = Duration::ZERO;
    cases.push(c);
    let mut c = base();
    c.defaults.timeout.total = Some(Duration::MAX);
    cases.push(c);
    let mut c = base();
    c.defaults.timeout.soft = Some(Duration::MAX);
    cases.push(c);
    let mut c = base();
    c.defaults.retry.max_attempts = 0;
    cases.push(c);
    let mut c = base();
    c.defaults.kind = Some(toolshield_core::CallKind::ReadOnly);
    c.defaults.cache.ttl = Duration::MAX;
    cases.push(c);
    let mut c = base();
    c.defaults.breaker.open_wait = Duration::MAX;
    cases.push(c);
    let mut c = base();
    c.defaults.idempotency.record_ttl = Duration::MAX;
    cases.push(c);
    let mut c = base();
    c.defaults.retry.rate_limit_backoff = Duration::MAX;
    cases.push(c);
    for (i, c) in cases.into_iter().enumerate() {
        assert!(c.validate().is_err(), "case {i} accepted");
        assert!(
            toolshield::Shield::from_config(c).is_err(),
            "case {i} built"
        );
    }
}
