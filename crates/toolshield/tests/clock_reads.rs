//! How many times one call through the default stack reads the clock. The first layer
//! stamps the call's entry on its state and every layer inside reads the stamp (the call
//! deadline counts from it); the attempt timeout reads the attempt's own start (each retry
//! gets a fresh budget); on the way out one reading serves provenance's duration and
//! wall-clock stamp and the metrics' duration. A soft threshold costs one read more, at
//! the attempt's end, and nothing when it is off. Counted with the contract's `clock-count` feature, which counts every read the
//! layers make through `toolshield_contract::time::now` on this thread.

use serde_json::json;
use toolshield::prelude::*;
use toolshield_contract::time;
use toolshield_test::BareTool;
use tower::{Service, ServiceExt};

/// The entry stamp, the attempt timeout's start and the one reading on the way out.
const MOST_PER_CALL: u64 = 3;
/// With a soft threshold: the attempt's end too.
const MOST_PER_CALL_WITH_SOFT: u64 = 4;

/// `tool`'s default stack under `config`, its metrics on an exporter of its own.
fn stack(
    config: ShieldConfig,
    tool: &str,
) -> impl Service<ToolRequest, Response = ToolResponse, Error = ToolError> {
    let exporter = toolshield::metrics::local_prometheus();
    let shield = Shield::from_config(config)
        .expect("shield")
        .with_metrics(&exporter)
        .expect("metrics");
    shield.wrap(tool, BareTool)
}

/// A read-only `quote` with a cache.
fn cached_quote() -> ShieldConfig {
    let config = r#"
[tools.quote]
kind = "read_only"
cache = { ttl = "10m" }
"#;
    ShieldConfig::from_toml_str(config).expect("config")
}

/// Counts the reads of one call to `tool` under `config` and checks them against `most`.
async fn assert_reads_at_most(config: ShieldConfig, tool: &str, most: u64) {
    let mut svc = stack(config, tool);
    // A first call registers the tool's series; it is not what is counted.
    let warm = ToolRequest::new(tool, json!({"n": 0})).kind(CallKind::ReadOnly);
    svc.ready()
        .await
        .expect("ready")
        .call(warm)
        .await
        .expect("ok");

    let req = ToolRequest::new(tool, json!({"n": 1})).kind(CallKind::ReadOnly);
    let before = time::reads();
    let res = svc
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect("ok");
    let reads = time::reads() - before;
    println!("{reads} clock reads");
    assert!(res.provenance.fetched_at.is_some());
    assert!(res.provenance.duration.is_some());
    assert!(
        reads <= most,
        "{reads} clock reads per call, at most {most} expected"
    );
}

#[tokio::test]
async fn a_call_with_a_deadline_and_a_soft_threshold_reads_the_clock_four_times_at_most() {
    let config = r#"
[defaults]
timeout = { attempt = "30s", soft = "2s", total = "60s" }

[tools.quote]
kind = "read_only"
"#;
    let config = ShieldConfig::from_toml_str(config).expect("config");
    assert_reads_at_most(config, "quote", MOST_PER_CALL_WITH_SOFT).await;
}

#[tokio::test]
async fn a_call_with_the_built_in_settings_reads_the_clock_four_times_at_most() {
    let config = r#"
[tools.quote]
kind = "read_only"
"#;
    let config = ShieldConfig::from_toml_str(config).expect("config");
    assert_reads_at_most(config, "quote", MOST_PER_CALL_WITH_SOFT).await;
}

#[tokio::test]
async fn without_a_soft_threshold_a_call_reads_the_clock_in_at_the_attempt_and_out() {
    let config = r#"{
        "defaults": {"timeout": {"attempt": "30s", "soft": null, "total": "60s"}},
        "tools": {"quote": {"kind": "read_only"}}
    }"#;
    let config = ShieldConfig::from_json_str(config).expect("config");
    assert_reads_at_most(config, "quote", MOST_PER_CALL).await;
}

/// A cache miss adds the stored copy's wall-clock stamp and the store's expiry; its looks
/// at the store (in `call`, and again when first polled) find nothing and read no clock.
#[tokio::test]
async fn a_cache_miss_reads_the_clock_twice_more_than_an_uncached_call() {
    assert_reads_at_most(cached_quote(), "quote", MOST_PER_CALL_WITH_SOFT + 2).await;
}

/// A fresh hit is answered in the cache layer's `call`: the entry stamp, the entry's time
/// left, and the reading on the way out.
#[tokio::test]
async fn a_cache_hit_reads_the_clock_three_times_at_most() {
    let mut svc = stack(cached_quote(), "quote");
    let call = || ToolRequest::new("quote", json!({"n": 1})).kind(CallKind::ReadOnly);
    let first = svc.ready().await.expect("ready").call(call()).await;
    assert!(!first.expect("ok").provenance.cache_hit);

    let before = time::reads();
    let res = svc
        .ready()
        .await
        .expect("ready")
        .call(call())
        .await
        .expect("ok");
    let reads = time::reads() - before;
    println!("{reads} clock reads");
    assert!(res.provenance.cache_hit, "the second call is a hit");
    assert!(
        reads <= 3,
        "{reads} clock reads per hit, at most 3 expected"
    );
}
