//! The `/metrics` text of a shield is valid Prometheus exposition whatever its breaker
//! registries hold: one `# TYPE` per family, before its samples, and no series twice.

use std::collections::{HashMap, HashSet};

use toolshield::metrics::local_prometheus;
use toolshield::prelude::*;

/// Checks the text format: every family has at most one `# HELP` and one `# TYPE`, both
/// before its first sample; no series (name and labels) is written twice. Returns the
/// value of every series.
fn check_exposition(text: &str) -> HashMap<String, String> {
    let mut typed: HashSet<String> = HashSet::new();
    let mut helped: HashSet<String> = HashSet::new();
    let mut sampled: HashSet<String> = HashSet::new();
    let mut series: HashMap<String, String> = HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap_or_default().to_owned();
            assert!(
                !sampled.contains(&name),
                "TYPE after samples: {line}\n{text}"
            );
            assert!(typed.insert(name), "second TYPE: {line}\n{text}");
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default().to_owned();
            assert!(helped.insert(name), "second HELP: {line}\n{text}");
        } else {
            let (id, value) = line.rsplit_once(' ').expect("a sample has a value");
            let name = id.split('{').next().unwrap_or_default();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
                .unwrap_or(name);
            sampled.insert(family.to_owned());
            assert!(
                series.insert(id.to_owned(), value.to_owned()).is_none(),
                "series written twice: {id}\n{text}"
            );
        }
    }
    series
}

#[tokio::test]
async fn every_family_is_rendered_once_with_several_breaker_registries() {
    let exporter = local_prometheus();
    let config = ShieldConfig::from_toml_str(
        "[tools.weather]\nkind = \"read_only\"\nbreaker = { consecutive_failures = 2 }\n\
         [tools.search]\nkind = \"read_only\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shield = Shield::from_config(config)
        .and_then(|s| s.with_metrics(&exporter))
        .unwrap_or_else(|e| panic!("{e}"));
    let registries = shield.breakers();
    assert!(registries.len() >= 2, "{:?}", registries.keys());
    shield.breaker_for("weather").force_open("weather");
    shield.breaker_for("search").force_open("search");
    // A key nobody registered, in every registry: `other` once, counting them all.
    for registry in registries.values() {
        registry.force_open("ghost");
    }
    let text = exporter.render();
    let series = check_exposition(&text);
    let get = |id: &str| series.get(id).map(String::as_str);
    assert_eq!(
        get(r#"circuit_breaker_state{key="weather",state="forced_open"}"#),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        get(r#"circuit_breaker_state{key="search",state="forced_open"}"#),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        get(r#"circuit_breaker_state{key="other",state="forced_open"}"#),
        Some(registries.len().to_string().as_str()),
        "{text}"
    );
    assert!(!text.contains("ghost"), "{text}");
}

/// A second `with_metrics` on a shield (or a clone of it) would register every collector
/// again, and every breaker series would be written twice: it is refused, and the text
/// stays valid.
#[tokio::test]
async fn metrics_are_attached_once() {
    let exporter = local_prometheus();
    let config = ShieldConfig::from_toml_str(
        "[tools.weather]\nkind = \"read_only\"\nbreaker = { consecutive_failures = 2 }\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shield = Shield::from_config(config)
        .and_then(|s| s.with_metrics(&exporter))
        .unwrap_or_else(|e| panic!("{e}"));
    let err = shield
        .clone()
        .with_metrics(&exporter)
        .expect_err("a second exporter is refused");
    assert!(err.to_string().contains("with_metrics"), "{err}");
    let other = local_prometheus();
    assert!(shield.clone().with_metrics(&other).is_err());
    shield.breaker_for("weather").force_open("weather");
    let text = exporter.render();
    let series = check_exposition(&text);
    assert_eq!(
        series
            .get(r#"circuit_breaker_state{key="weather",state="forced_open"}"#)
            .map(String::as_str),
        Some("1"),
        "{text}"
    );
}
