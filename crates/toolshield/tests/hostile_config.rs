//! Hostile configuration documents and `TOOLSHIELD_*` overrides: "invalid config lists
//! every problem" (each with its path), and no input makes loading, building the shield,
//! or a first call panic.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use serde_json::{json, Value};
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use tower::{service_fn, ServiceExt};

/// Every leaf setting of a tool section, as a JSON path below the section.
const LEAVES: &[&str] = &[
    "kind",
    "timeout.attempt",
    "timeout.soft",
    "timeout.total",
    "timeout.idle",
    "retry.max_attempts",
    "retry.rate_limit_backoff",
    "retry.max_retry_after",
    "retry.min_attempt_time",
    "retry.budget.enabled",
    "retry.budget.ratio",
    "retry.budget.min_per_sec",
    "retry.budget.burst",
    "breaker.consecutive_failures",
    "breaker.min_calls",
    "breaker.failure_rate",
    "breaker.slow_call_rate",
    "breaker.slow_call_duration",
    "breaker.open_wait",
    "breaker.open_wait_multiplier",
    "breaker.max_open_wait",
    "breaker.half_open_permits",
    "breaker.half_open_successes",
    "breaker.max_keys",
    "breaker.idle_ttl",
    "cache.ttl",
    "cache.stale_if_error",
    "cache.per_user",
    "idempotency.derive_keys",
    "idempotency.key_window",
    "idempotency.scope_keys_by_caller",
    "idempotency.record_ttl",
    "idempotency.failed_ttl",
    "idempotency.lease",
    "idempotency.on_pending",
    "idempotency.wait_timeout",
    "idempotency.poll_interval",
    "idempotency.max_poll_interval",
    "idempotency.on_store_error",
    "idempotency.record_retry",
    "budget.max_calls",
    "budget.cost",
    "hedge.enabled",
    "hedge.delay",
    "hedge.max_hedges",
    "rate_limit.rate",
    "rate_limit.period",
    "rate_limit.burst",
    "rate_limit.max_wait",
    "rate_limit.max_keys",
    "rate_limit.key",
    "rate_limit.on_limit",
    "bulkhead.max_concurrent",
    "bulkhead.max_queue",
    "bulkhead.queue_timeout",
    "bulkhead.max_keys",
    "bulkhead.key",
];

fn hostile_values() -> Vec<Value> {
    vec![
        json!("0s"),
        json!("0ms"),
        json!("1ns"),
        json!("-1s"),
        json!("1000000000d"),
        json!("366d"),
        json!("367d"),
        json!("18446744073709551615s"),
        json!("99999999999999999999999s"),
        json!("584942417355y"),
        json!(""),
        json!(" "),
        json!("1.5s"),
        json!("nan"),
        json!(0),
        json!(-1),
        json!(1),
        json!(2),
        json!(65536),
        json!(4294967295u64),
        json!(4294967296u64),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e308),
        json!(-1e308),
        json!(0.0),
        json!(1e-300),
        json!(0.5),
        json!(100.0),
        json!(true),
        json!(null),
        json!([]),
        json!({}),
        json!("read_only"),
        json!("mutating"),
        json!("\u{202e}x"),
    ]
}

/// A document with `value` at `leaf` of `tools.t` (or of `defaults`), and a tool `t`.
fn doc(section: &str, leaf: &str, value: &Value) -> Value {
    let mut root = json!({ "tools": { "t": {} } });
    let base = if section == "defaults" {
        root.as_object_mut()
            .unwrap()
            .insert("defaults".into(), json!({}));
        root.get_mut("defaults").unwrap()
    } else {
        root.get_mut("tools").unwrap().get_mut("t").unwrap()
    };
    let mut at = base;
    let parts: Vec<&str> = leaf.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        at = at
            .as_object_mut()
            .unwrap()
            .entry(part.to_string())
            .or_insert_with(|| json!({}));
    }
    at.as_object_mut()
        .unwrap()
        .insert(parts[parts.len() - 1].to_owned(), value.clone());
    root
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// Builds the shield of `config` and makes a few calls of `t` (success, failure, with a
/// caller and a key), on a paused clock. `Err` with the panic text when anything panics.
fn exercise(config: ShieldConfig) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(async move {
            let shield = match Shield::from_config(config) {
                Ok(shield) => shield,
                Err(e) => {
                    if std::env::var("HOSTILE_VERBOSE").is_ok() {
                        println!("shield refused: {e}");
                    }
                    return;
                }
            };
            let ok = shield.wrap(
                "t",
                service_fn(|_req: ToolRequest| async {
                    Ok::<_, ToolError>(ToolResponse::new(json!({"ok": true})))
                }),
            );
            let failing = shield.wrap(
                "t",
                service_fn(|_req: ToolRequest| async {
                    Err::<ToolResponse, _>(ToolError::new(
                        toolshield_core::ErrorKind::UpstreamUnavailable,
                        "down",
                    ))
                }),
            );
            for kind in [CallKind::ReadOnly, CallKind::Idempotent, CallKind::Mutating] {
                let req = ToolRequest::new("t", json!({"a": 1}))
                    .kind(kind)
                    .caller("alice")
                    .run_id("run-1")
                    .idempotency_key("k-1");
                let _ = tokio::time::timeout(
                    Duration::from_secs(3 * 366 * 86_400),
                    ok.clone().oneshot(req.clone()),
                )
                .await;
                let _ = tokio::time::timeout(
                    Duration::from_secs(3 * 366 * 86_400),
                    failing.clone().oneshot(req),
                )
                .await;
            }
        })
    }));
    outcome.map_err(|p| panic_text(&*p))
}

#[test]
fn no_leaf_value_makes_loading_building_or_calling_panic() {
    let mut failures = Vec::new();
    for section in ["defaults", "tool"] {
        for leaf in LEAVES {
            for value in hostile_values() {
                let d = doc(section, leaf, &value);
                let text = d.to_string();
                let loaded = catch_unwind(|| ShieldConfig::from_json_str(&text));
                let loaded = match loaded {
                    Ok(l) => l,
                    Err(p) => {
                        failures.push(format!(
                            "{section} {leaf} = {value}: load panicked: {}",
                            panic_text(&*p)
                        ));
                        continue;
                    }
                };
                match loaded {
                    Ok(config) => {
                        if let Err(p) = exercise(config) {
                            failures.push(format!("{section} {leaf} = {value}: panicked: {p}"));
                        }
                    }
                    Err(e) => {
                        for p in e.problems() {
                            if p.field.is_empty() {
                                failures.push(format!(
                                    "{section} {leaf} = {value}: problem without a path: {p}"
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Deeply nested documents. A stack overflow aborts the whole process (it cannot be caught),
// so each shape is parsed in a child process: this test binary run again on
// `deep_toml_child` with the shape in `HOSTILE_DEEP_TOML`.

/// Nesting depth of the hostile documents: 100,000 levels, about 200 KB of text (a
/// reload's body may be 1 MiB).
const DEPTH: usize = 100_000;

fn deep_toml(shape: &str) -> String {
    match shape {
        "arrays" => format!("x = {}{}", "[".repeat(DEPTH), "]".repeat(DEPTH)),
        "inline_tables" => format!("x = {}1{}", "{a = ".repeat(DEPTH), "}".repeat(DEPTH)),
        "dotted_keys" => format!("{} = 1", vec!["a"; DEPTH].join(".")),
        "table_header" => format!("[tools.t.schema.{}]\nb = 1", vec!["a"; DEPTH].join(".")),
        other => panic!("unknown shape {other}"),
    }
}

/// The child: parses one deep document; a refusal or an acceptance are both fine, a
/// crash is not. Does nothing when not run as a child.
#[test]
fn deep_toml_child() {
    let Ok(shape) = std::env::var("HOSTILE_DEEP_TOML") else {
        return;
    };
    let text = deep_toml(&shape);
    let result = ShieldConfig::from_toml_str(&text);
    println!(
        "child {shape}: parsed, ok = {} {:?}",
        result.is_ok(),
        result
            .err()
            .map(|e| e.to_string().chars().take(200).collect::<String>())
    );
}

/// "Never panic on input", and a reload's body is parsed by `from_toml_str`: a document
/// nested 100,000 levels deep (arrays, inline tables, dotted keys, a table header) is
/// refused or read, never a stack overflow that aborts the process.
#[test]
fn a_deeply_nested_toml_document_never_crashes_the_process() {
    if std::env::var("HOSTILE_DEEP_TOML").is_ok() {
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let mut crashed = Vec::new();
    for shape in ["arrays", "inline_tables", "dotted_keys", "table_header"] {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "deep_toml_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("HOSTILE_DEEP_TOML", shape)
            .output()
            .expect("run the child");
        if !out.status.success() {
            crashed.push(format!(
                "{shape}: {:?}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .filter(|l| l.contains("overflow") || l.contains("panicked"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
    }
    assert!(
        crashed.is_empty(),
        "the process crashed:\n{}",
        crashed.join("\n")
    );
}

/// Every setting at the largest value the checks accept, together (each duration 366
/// days, each count at its bound): the shield builds or refuses, and calls never panic.
#[test]
fn every_setting_at_its_largest_accepted_value_never_panics() {
    let big = "366d";
    let tool = json!({
        "timeout": { "attempt": big, "soft": "365d", "total": big, "idle": big },
        "retry": {
            "max_attempts": 10,
            "rate_limit_backoff": big, "max_retry_after": big, "min_attempt_time": big,
            "backoff": { "strategy": "exponential", "base": big, "factor": 1e300, "cap": big },
            "budget": { "ratio": 1000.0, "min_per_sec": u32::MAX, "burst": u32::MAX }
        },
        "breaker": {
            "consecutive_failures": u32::MAX, "min_calls": 1,
            "window": { "type": "count", "size": 1_048_576 },
            "open_wait": big, "open_wait_multiplier": 1e300, "max_open_wait": big,
            "half_open_permits": 65_535, "half_open_successes": 65_535,
            "max_keys": 10_000_000, "idle_ttl": big, "slow_call_duration": big
        },
        "idempotency": {
            "key_window": big, "record_ttl": big, "failed_ttl": big, "lease": big,
            "wait_timeout": big, "poll_interval": big, "max_poll_interval": big,
            "record_retry": big
        },
        "rate_limit": { "rate": u32::MAX, "period": big, "max_wait": big, "max_keys": 10_000_000 },
        "bulkhead": { "max_concurrent": 268_435_456, "max_queue": 1_048_576, "queue_timeout": big },
        "budget": { "max_calls": 9_007_199_254_740_991u64, "cost": 9_007_199_254_740_991u64 },
    });
    let mut variants = vec![tool.clone()];
    let mut decorrelated = tool.clone();
    decorrelated["retry"]["backoff"] =
        json!({ "strategy": "decorrelated", "base": big, "cap": big });
    variants.push(decorrelated);
    let mut fixed = tool.clone();
    fixed["retry"]["backoff"] = json!({ "strategy": "fixed", "min": big, "max": big });
    variants.push(fixed);
    let mut time_window = tool;
    time_window["breaker"]["window"] = json!({ "type": "time", "duration": big, "buckets": 4096 });
    time_window["timeout"] =
        json!({ "attempt": "100d", "soft": "99d", "total": big, "idle": "100d" });
    variants.push(time_window);
    let mut failures = Vec::new();
    for (i, t) in variants.into_iter().enumerate() {
        let doc = json!({ "tools": { "t": t }, "runs": { "run_max_cost": 9_007_199_254_740_991u64, "run_ttl": big } });
        match ShieldConfig::from_value(doc) {
            Ok(config) => {
                if let Err(p) = exercise(config) {
                    failures.push(format!("variant {i}: panicked: {p}"));
                }
            }
            Err(e) => println!("variant {i} refused: {e}"),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
