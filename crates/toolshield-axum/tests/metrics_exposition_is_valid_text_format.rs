//! `GET /metrics` scraped over HTTP from a real server after calls with tool names and
//! breaker keys chosen to break a careless writer (quotes, backslashes, line feeds,
//! non-ASCII, a 10 KB name), checked with a strict reader of the Prometheus text
//! exposition format 0.0.4 written here: one `# HELP` and one `# TYPE` per family before
//! its samples, a family's lines in one group, metric and label names of the grammar,
//! only the escapes the format defines, counters named `_total`, histograms with
//! cumulative buckets ending in `le="+Inf"` equal to `_count` and a `_sum`, no series
//! twice. The label sets stay bounded whatever callers send, and no payload value,
//! caller id or trace id becomes a label.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::json;
use toolshield::collectors::BreakerMetrics;
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_axum::ShieldRouter;
use toolshield_breaker::{BreakerConfig, BreakerRegistry};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_metrics::{local_prometheus, PROMETHEUS_CONTENT_TYPE};
use tower::{service_fn, ServiceExt};

use support::{request, serve};

type Labels = BTreeMap<String, String>;

/// One exposition, read strictly.
#[derive(Debug, Default)]
struct Exposition {
    types: HashMap<String, String>,
    samples: BTreeMap<(String, Labels), f64>,
}

impl Exposition {
    fn label_values(&self, family_prefix: &str, label: &str) -> BTreeSet<String> {
        self.samples
            .keys()
            .filter(|(n, _)| n.starts_with(family_prefix))
            .filter_map(|(_, l)| l.get(label).cloned())
            .collect()
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples.get(&(name.to_owned(), labels)).copied()
    }
}

fn metric_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(x) if x.is_ascii_alphabetic() || x == '_' || x == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn label_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(x) if x.is_ascii_alphabetic() || x == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
        && !s.starts_with("__")
}

/// HELP text: only `\\` and `\n` are escapes; a backslash before anything else is not.
fn check_help(help: &str) -> Result<(), String> {
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && !matches!(chars.next(), Some('\\' | 'n')) {
            return Err(format!("bad escape in HELP `{help}`"));
        }
    }
    Ok(())
}

fn value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s
            .parse::<f64>()
            .map_err(|e| format!("bad value `{s}`: {e}")),
    }
}

/// `name{labels}` and the rest of the line.
fn sample(line: &str) -> Result<(String, Labels, &str), String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Labels::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest.find('=').ok_or("label without `=`")?;
            let lname = &rest[..eq];
            if !label_name(lname) {
                return Err(format!("bad label name `{lname}`"));
            }
            let mut chars = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or("label value not quoted")?
                .char_indices();
            let body = &rest[eq + 2..];
            let mut v = String::new();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => v.push('\n'),
                        Some((_, '\\')) => v.push('\\'),
                        Some((_, '"')) => v.push('"'),
                        other => return Err(format!("bad escape {other:?}")),
                    },
                    Some((i, '"')) => break i,
                    Some((_, '\n')) => return Err("raw line feed in a label value".into()),
                    Some((_, c)) => v.push(c),
                    None => return Err("unterminated label value".into()),
                }
            };
            if labels.insert(lname.to_owned(), v).is_some() {
                return Err(format!("label `{lname}` twice"));
            }
            rest = &body[end + 1..];
            if let Some(r) = rest.strip_prefix(',') {
                rest = r;
            } else if !rest.starts_with('}') {
                return Err("labels not separated by `,`".into());
            }
        }
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    Ok((name.to_owned(), labels, rest))
}

fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(f) = name.strip_suffix(suffix) {
            if types
                .get(f)
                .is_some_and(|t| t == "histogram" || t == "summary")
            {
                return f;
            }
        }
    }
    name
}

fn parse(text: &str) -> Result<Exposition, String> {
    let mut exp = Exposition::default();
    let mut help_seen = BTreeSet::new();
    let mut closed: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut with_samples = BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        let ctx = |e: String| {
            format!(
                "line {}: {e}: `{}`",
                n + 1,
                line.chars().take(200).collect::<String>()
            )
        };
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            let mut parts = rest.splitn(3, ' ');
            let (word, name, tail) = (parts.next(), parts.next(), parts.next());
            if !matches!(word, Some("HELP" | "TYPE")) {
                continue;
            }
            let name = name.ok_or_else(|| ctx("no metric name".into()))?;
            if !metric_name(name) {
                return Err(ctx(format!("bad metric name `{name}`")));
            }
            if closed.contains(name) || with_samples.contains(name) {
                return Err(ctx(format!("`{name}` declared after its samples")));
            }
            if current.as_deref() != Some(name) {
                if let Some(c) = current.take() {
                    closed.insert(c);
                }
                current = Some(name.to_owned());
            }
            if word == Some("HELP") {
                check_help(tail.unwrap_or("")).map_err(ctx)?;
                if !help_seen.insert(name.to_owned()) {
                    return Err(ctx(format!("HELP of `{name}` twice")));
                }
            } else {
                let kind = tail.unwrap_or("");
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(ctx(format!("unknown type `{kind}`")));
                }
                if exp.types.insert(name.to_owned(), kind.to_owned()).is_some() {
                    return Err(ctx(format!("TYPE of `{name}` twice")));
                }
            }
            continue;
        }
        let (name, labels, rest) = sample(line).map_err(ctx)?;
        if !metric_name(&name) {
            return Err(ctx(format!("bad metric name `{name}`")));
        }
        let mut fields = rest.split(' ');
        let v = value(fields.next().unwrap_or("")).map_err(ctx)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .map_err(|e| ctx(format!("bad timestamp: {e}")))?;
        }
        if fields.next().is_some() {
            return Err(ctx("trailing fields".into()));
        }
        let family = family_of(&name, &exp.types).to_owned();
        let Some(kind) = exp.types.get(&family) else {
            return Err(ctx(format!("sample of undeclared family `{family}`")));
        };
        if kind == "counter" && !family.ends_with("_total") {
            return Err(ctx(format!("counter `{family}` not named `_total`")));
        }
        if current.as_deref() != Some(family.as_str()) {
            if closed.contains(&family) || with_samples.contains(&family) {
                return Err(ctx(format!("lines of `{family}` not in one group")));
            }
            if let Some(c) = current.take() {
                closed.insert(c);
            }
            current = Some(family.clone());
        }
        with_samples.insert(family);
        if exp.samples.insert((name, labels), v).is_some() {
            return Err(ctx("the same series twice".into()));
        }
    }
    for (family, kind) in &exp.types {
        if kind != "histogram" {
            continue;
        }
        let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
        for ((n, labels), v) in &exp.samples {
            if *n != format!("{family}_bucket") {
                continue;
            }
            let mut base = labels.clone();
            let le = base.remove("le").ok_or("a bucket without `le`")?;
            series.entry(base).or_default().push((value(&le)?, *v));
        }
        for (base, mut buckets) in series {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{family}{base:?}: buckets not cumulative"));
            }
            let last = buckets.last().ok_or("no bucket")?;
            if last.0 != f64::INFINITY {
                return Err(format!("{family}{base:?}: no `+Inf` bucket"));
            }
            let count = exp.samples.get(&(format!("{family}_count"), base.clone()));
            if count != Some(&last.1) {
                return Err(format!(
                    "{family}{base:?}: +Inf {} != _count {count:?}",
                    last.1
                ));
            }
            if !exp
                .samples
                .contains_key(&(format!("{family}_sum"), base.clone()))
            {
                return Err(format!("{family}{base:?}: no _sum"));
            }
        }
    }
    Ok(exp)
}

/// Names a careless writer would break.
fn awkward_names() -> Vec<String> {
    vec![
        "plain".to_owned(),
        "we\"ather".to_owned(),
        "back\\slash".to_owned(),
        "a\\\"b".to_owned(),
        "a\"b".to_owned(),
        "a\\\\b".to_owned(),
        "a\\b".to_owned(),
        "line\nfeed".to_owned(),
        "trailing\\".to_owned(),
        "ünïcødé-€-天気".to_owned(),
        "x".repeat(10 * 1024),
    ]
}

const SECRET: &str = "SECRET-PAYLOAD-VALUE";
const CALLER: &str = "alice@example.com";
const TRACE: &str = "trace-of-alice";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_awkward_tool_names_parse_strictly_and_stay_bounded() {
    let exporter = local_prometheus();
    let shield = Shield::from_config(ShieldConfig::default())
        .unwrap()
        .with_metrics(&exporter)
        .unwrap();
    // The router refuses names with control characters and overlong ones: those are
    // called below as names no route holds.
    let (names, refused): (Vec<String>, Vec<String>) = awkward_names()
        .into_iter()
        .partition(|n| !n.contains('\n') && n.len() <= 256);
    assert_eq!(refused.len(), 2);
    let mut builder = shield.router();
    for name in &names {
        builder = builder.tool(
            name,
            service_fn(|req: ToolRequest| async move {
                if req.payload()["fail"].as_bool() == Some(true) {
                    Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
                } else {
                    Ok(ToolResponse::new(json!({ "echo": req.payload().clone() })))
                }
            }),
        );
    }
    let tools = builder.build().unwrap();
    let call = |tool: String, fail: bool| {
        let tools = tools.clone();
        async move {
            let req = ToolRequest::new(tool, json!({ "secret": SECRET, "fail": fail }))
                .kind(CallKind::ReadOnly)
                .caller(CALLER)
                .trace_id(TRACE);
            tools.oneshot(req).await
        }
    };
    for name in &names {
        call(name.clone(), false).await.unwrap();
        call(name.clone(), false).await.unwrap();
    }
    // Failures enough to open the breaker of one awkward name.
    for _ in 0..10 {
        let _ = call("we\"ather".to_owned(), true).await;
    }
    // Names no route holds, as a confused model would invent them.
    for name in &refused {
        assert_eq!(
            call(name.clone(), false).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
    for i in 0..2_000 {
        let err = call(format!("invented\"\\\n{i}-{SECRET}"), false)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
    }

    let ops = ShieldRouter::new()
        .metrics(exporter)
        .breakers(shield.breakers())
        .build();
    let addr = serve(ops).await;
    let a = request("GET", format!("http://{addr}/metrics"), None).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.content_type, PROMETHEUS_CONTENT_TYPE);
    let exp = parse(&a.body).unwrap_or_else(|e| panic!("invalid exposition: {e}"));

    for family in [
        "tool_execution_total",
        "tool_duration_seconds",
        "circuit_breaker_state",
    ] {
        assert!(exp.types.contains_key(family), "no `{family}`");
    }
    // Every name is a series of its own, with its exact count.
    for name in &names {
        let successes = exp.value(
            "tool_execution_total",
            &[("tool", name), ("status", "success")],
        );
        assert_eq!(
            successes,
            Some(2.0),
            "tool {:?}",
            &name[..name.len().min(20)]
        );
        assert_eq!(
            exp.value(
                "tool_duration_seconds_count",
                &[("tool", name), ("status", "success")]
            ),
            Some(2.0)
        );
    }
    let open = exp.value(
        "circuit_breaker_state",
        &[("key", "we\"ather"), ("state", "open")],
    );
    assert_eq!(open, Some(1.0));
    // Bounded: the registered names and `other`, nothing a caller chose.
    let allowed: BTreeSet<String> = names.iter().cloned().chain(["other".to_owned()]).collect();
    for (family, label) in [("tool_", "tool"), ("circuit_breaker_", "key")] {
        let values = exp.label_values(family, label);
        assert!(
            values.is_subset(&allowed),
            "{label}: {:?}",
            values.difference(&allowed).collect::<Vec<_>>()
        );
    }
    for leak in [SECRET, CALLER, TRACE, "invented"] {
        assert!(!a.body.contains(leak), "`{leak}` in /metrics");
    }
}

/// Breaker keys chosen per caller: a hand-built collector names at most its limit, every
/// other key is `other`, and the awkward ones are written exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_many_awkward_breaker_keys_parse_strictly_and_stay_bounded() {
    let exporter = local_prometheus();
    let config = BreakerConfig {
        max_keys: 20_000,
        ..BreakerConfig::default()
    };
    let registry = BreakerRegistry::new(config.clone()).unwrap();
    let second = BreakerRegistry::new(config).unwrap();
    let names = awkward_names();
    for key in names
        .iter()
        .filter(|k| k.len() <= toolshield_breaker::MAX_KEY_LEN)
    {
        registry.force_open(key);
        second.force_closed(key);
    }
    for i in 0..5_000 {
        registry.reset(&format!("caller-{i}\"\\\n"));
    }
    exporter.add_collector(BreakerMetrics::new(registry, exporter.target()).max_named_keys(100));
    exporter.add_collector(BreakerMetrics::new(second, exporter.target()).max_named_keys(100));
    let addr = serve(ShieldRouter::new().metrics(exporter).build()).await;
    let a = request("GET", format!("http://{addr}/metrics"), None).await;
    assert_eq!(a.content_type, PROMETHEUS_CONTENT_TYPE);
    let exp = parse(&a.body).unwrap_or_else(|e| panic!("invalid exposition: {e}"));
    let keys = exp.label_values("circuit_breaker_state", "key");
    assert!(keys.len() <= 2 * 100 + 1, "{} keys", keys.len());
    assert!(keys.contains("other"));
    for key in names
        .iter()
        .filter(|k| k.len() <= toolshield_breaker::MAX_KEY_LEN)
    {
        assert!(keys.contains(key), "{key:?} not named");
    }
}

/// A stack with a cache, idempotency, a schema and two breaker registries: the families
/// the documents promise are there, each family once, and the whole text parses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_a_configured_stack_have_the_promised_families_once_each() {
    let config = ShieldConfig::from_toml_str(
        r#"
[tools.weather]
kind = "read_only"
cache = { ttl = "5m" }

[tools.search]
kind = "read_only"
breaker = { consecutive_failures = 1 }

[tools.pay]
kind = "mutating"

[tools.pay.schema]
type = "object"
required = ["amount"]

[tools.pay.schema.properties.amount]
type = "integer"
"#,
    )
    .unwrap();
    let exporter = local_prometheus();
    let shield = Shield::from_config(config)
        .unwrap()
        .with_metrics(&exporter)
        .unwrap();
    assert!(
        shield.breakers().len() >= 2,
        "{:?}",
        shield.breakers().keys()
    );
    let ok = || {
        service_fn(|req: ToolRequest| async move {
            if req.tool() == "search" {
                Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
            } else {
                Ok(ToolResponse::new(json!({"ok": true})))
            }
        })
    };
    let tools = shield
        .router()
        .tool("weather", ok())
        .tool("search", ok())
        .tool("pay", ok())
        .build()
        .unwrap();
    let call = |tool: &'static str, payload: serde_json::Value, key: Option<&'static str>| {
        let tools = tools.clone();
        async move {
            let mut req = ToolRequest::new(tool, payload)
                .caller(CALLER)
                .trace_id(TRACE);
            if let Some(k) = key {
                req = req.idempotency_key(k);
            }
            tools.oneshot(req).await
        }
    };
    for _ in 0..3 {
        call("weather", json!({"city": SECRET}), None)
            .await
            .unwrap();
        let _ = call("search", json!({"q": SECRET}), None).await;
        call("pay", json!({"amount": 5}), Some("order-1"))
            .await
            .unwrap();
    }
    let invalid = call("pay", json!({"amount": SECRET}), Some("order-2")).await;
    assert_eq!(invalid.unwrap_err().kind(), ErrorKind::InvalidInput);

    let ops = ShieldRouter::new()
        .metrics(exporter)
        .breakers(shield.breakers())
        .build();
    let addr = serve(ops).await;
    let a = request("GET", format!("http://{addr}/metrics"), None).await;
    assert_eq!(a.content_type, PROMETHEUS_CONTENT_TYPE);
    let exp = parse(&a.body).unwrap_or_else(|e| panic!("invalid exposition: {e}"));
    for (family, kind) in [
        ("tool_execution_total", "counter"),
        ("tool_duration_seconds", "histogram"),
        ("circuit_breaker_state", "gauge"),
        ("circuit_breaker_transitions_total", "counter"),
        ("idempotency_cache_hits_total", "counter"),
        ("tool_cache_hits_total", "counter"),
        ("tool_errors_total", "counter"),
    ] {
        assert_eq!(
            exp.types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    assert_eq!(
        exp.value("tool_cache_hits_total", &[("tool", "weather")]),
        Some(2.0)
    );
    assert_eq!(
        exp.value("idempotency_cache_hits_total", &[("tool", "pay")]),
        Some(2.0)
    );
    assert_eq!(
        exp.value(
            "circuit_breaker_state",
            &[("key", "search"), ("state", "open")]
        ),
        Some(1.0)
    );
    assert_eq!(
        exp.value(
            "tool_errors_total",
            &[("tool", "pay"), ("code", "INVALID_INPUT")]
        ),
        Some(1.0)
    );
    for leak in [SECRET, CALLER, TRACE, "order-1"] {
        assert!(!a.body.contains(leak), "`{leak}` in /metrics");
    }
}
