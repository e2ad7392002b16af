//! The `key` label of the breaker metrics is bounded: a flood of distinct breaker keys
//! (tool names a model chose behind `server__*`) leaves a bounded exposition and bounded
//! collector state, evicted keys leave the next scrape, and the counts of keys reported as
//! `other` are added to `other`, which never goes down.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::advance;
use toolshield::collectors::BreakerMetrics;
use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::{local_prometheus, PrometheusExporter};
use toolshield_test::{BoxedTool, FailOnPayload};
use tower::Layer;

use support::{parse, Exposition};

type Svc = BoxedTool;

const TRANSITIONS: &str = "circuit_breaker_transitions_total";
const REJECTIONS: &str = "circuit_breaker_rejections_total";
const STATE: &str = "circuit_breaker_state";

fn setup(config: BreakerConfig) -> (Svc, BreakerRegistry) {
    let layer = BreakerLayer::from_config(&config).expect("valid config");
    let registry = layer.registry().clone();
    let tool = FailOnPayload::new("r", ErrorKind::UpstreamUnavailable);
    (BoxedTool::new(layer.layer(tool)), registry)
}

async fn call(svc: &mut Svc, key: &str, r: &str) -> Result<ToolResponse, ToolError> {
    toolshield_test::call(svc, ToolRequest::new(key, json!({ "r": r }))).await
}

/// Opens `key`'s breaker, has it reject a call, then closes it (wait 1 s, a probe).
async fn cycle(svc: &mut Svc, key: &str) {
    let _ = call(svc, key, "fail").await;
    let _ = call(svc, key, "ok").await;
    advance(Duration::from_secs(1)).await;
    call(svc, key, "ok").await.unwrap();
}

fn scrape(exporter: &PrometheusExporter) -> Exposition {
    let text = exporter.render();
    parse(&text).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{text}"))
}

/// Every `key` label value of the breaker families.
fn keys(exp: &Exposition) -> BTreeSet<String> {
    [STATE, TRANSITIONS, REJECTIONS]
        .iter()
        .flat_map(|name| exp.series(name).into_keys())
        .filter_map(|labels| labels.get("key").cloned())
        .collect()
}

/// `other`'s counters, by (from, to) and for rejections.
fn other_counts(exp: &Exposition) -> BTreeMap<(String, String), f64> {
    let mut out: BTreeMap<(String, String), f64> = exp
        .series(TRANSITIONS)
        .into_iter()
        .filter(|(l, _)| l["key"] == "other")
        .map(|(l, v)| ((l["from"].clone(), l["to"].clone()), v))
        .collect();
    if let Some(v) = exp.value(REJECTIONS, &[("key", "other")]) {
        out.insert(("rejections".into(), String::new()), v);
    }
    out
}

fn sum(exp: &Exposition, name: &str) -> f64 {
    exp.series(name).values().sum()
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_breaker_keys_keeps_series_and_collector_state_bounded() {
    let (mut svc, registry) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(1),
        max_keys: 10,
        ..BreakerConfig::default()
    });
    let events = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&events);
    registry.on_event(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
    });
    // Three collectors: names for the first keys seen (the default), at most 3 names,
    // and one known key, held all along (forced open: never evicted).
    let (default, capped, listed) = (local_prometheus(), local_prometheus(), local_prometheus());
    let default_metrics = BreakerMetrics::new(registry.clone(), default.target());
    default.add_collector(default_metrics.clone());
    capped.add_collector(BreakerMetrics::new(registry.clone(), capped.target()).max_named_keys(3));
    listed.add_collector(
        BreakerMetrics::new(registry.clone(), listed.target()).known_keys(["stable"]),
    );
    registry.force_open("stable");

    let mut last_other = BTreeMap::new();
    for i in 0..2_000 {
        cycle(&mut svc, &format!("server__tool-{i}")).await;
        if i % 40 != 39 {
            continue;
        }
        let d = scrape(&default);
        let c = scrape(&capped);
        let l = scrape(&listed);
        assert!(keys(&d).len() <= 11, "{:?}", keys(&d)); // 10 held keys and `other`
        assert!(keys(&c).len() <= 4, "{:?}", keys(&c));
        let listed_keys: Vec<String> = keys(&l).into_iter().collect();
        assert_eq!(listed_keys, ["other", "stable"]);
        assert!(default_metrics.tracked_keys() <= 10);
        // `other` never goes down.
        let other = other_counts(&l);
        for (cell, before) in &last_other {
            assert!(
                other.get(cell).copied().unwrap_or(0.0) >= *before,
                "{cell:?} went down"
            );
        }
        last_other = other;
    }
    assert!(registry.len() <= 10);

    // With every key but `stable` reported as `other`, the sums over keys are every
    // transition and every rejection that happened, evicted breakers included.
    drop(svc); // it holds the breaker of its last key
    let l = scrape(&listed);
    assert_eq!(sum(&l, TRANSITIONS), events.load(Ordering::SeqCst) as f64);
    let rejections = registry.evicted_counts().rejections
        + registry
            .status_all()
            .iter()
            .map(|s| s.rejections)
            .sum::<u64>();
    assert!(rejections > 1_000);
    assert_eq!(sum(&l, REJECTIONS), rejections as f64);
    // The state gauge of `other` counts the breakers it stands for.
    assert_eq!(sum(&l, STATE), registry.len() as f64);
}

#[tokio::test(start_paused = true)]
async fn an_evicted_key_leaves_the_next_scrape_and_its_counts_stay_counted() {
    let (mut svc, registry) = setup(BreakerConfig {
        consecutive_failures: 1,
        open_wait: Duration::from_secs(1),
        ..BreakerConfig::default()
    });
    let named = local_prometheus();
    named.add_collector(BreakerMetrics::new(registry.clone(), named.target()));
    let folded = local_prometheus();
    folded.add_collector(BreakerMetrics::new(registry.clone(), folded.target()).max_named_keys(0));

    cycle(&mut svc, "weather").await;
    call(&mut svc, "search", "ok").await.unwrap();
    let n = scrape(&named);
    assert_eq!(
        keys(&n),
        BTreeSet::from(["search".into(), "weather".into()])
    );
    assert_eq!(
        n.value(
            TRANSITIONS,
            &[("key", "weather"), ("from", "half_open"), ("to", "closed")]
        ),
        Some(1.0)
    );
    let f = scrape(&folded);
    assert_eq!(keys(&f), BTreeSet::from(["other".into()]));
    assert_eq!(sum(&f, TRANSITIONS), 3.0);
    assert_eq!(
        f.value(STATE, &[("key", "other"), ("state", "closed")]),
        Some(2.0)
    );

    // Both breakers go idle and are evicted.
    assert_eq!(registry.evict_idle(), 0);
    assert_eq!(registry.evict_idle(), 2);
    assert!(registry.is_empty());

    let n = scrape(&named);
    assert!(
        keys(&n).is_empty(),
        "evicted keys left the scrape: {:?}",
        keys(&n)
    );
    assert!(
        other_counts(&n).is_empty(),
        "a named key's counts end with its series, not in `other`"
    );
    let f = scrape(&folded);
    assert_eq!(
        sum(&f, TRANSITIONS),
        3.0,
        "folded counts are kept in `other`"
    );
    assert_eq!(
        f.value(STATE, &[("key", "other"), ("state", "closed")]),
        Some(0.0)
    );

    // The key comes back: a new series from zero.
    call(&mut svc, "weather", "ok").await.unwrap();
    let n = scrape(&named);
    assert_eq!(
        n.value(STATE, &[("key", "weather"), ("state", "closed")]),
        Some(1.0)
    );
    assert_eq!(sum(&n, TRANSITIONS), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_key_named_other_or_needing_escapes_cannot_forge_a_series() {
    let registry = BreakerRegistry::default();
    let exporter = local_prometheus();
    exporter.add_collector(BreakerMetrics::new(registry.clone(), exporter.target()));
    registry.force_open("other");
    registry.force_open("a\",state=\"x\\\n");
    let exp = scrape(&exporter);
    assert_eq!(
        keys(&exp),
        BTreeSet::from(["other".into(), "a\",state=\"x\\\n".into()])
    );
    assert_eq!(
        exp.value(STATE, &[("key", "other"), ("state", "forced_open")]),
        Some(1.0)
    );
    assert_eq!(exp.series(STATE).len(), 12);
}
