//! A small parser of the Prometheus text exposition format (0.0.4), strict enough to
//! catch malformed output: every sample belongs to a declared family, label syntax and
//! escapes are checked, histogram buckets are cumulative and end with `+Inf` = `_count`.

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, HashMap};

/// Labels of one sample, sorted by name.
pub type Labels = BTreeMap<String, String>;

/// One parsed exposition.
#[derive(Debug, Default)]
pub struct Exposition {
    /// Family name -> type.
    pub types: HashMap<String, String>,
    /// Family name -> help.
    pub help: HashMap<String, String>,
    /// (sample name, labels) -> value.
    pub samples: BTreeMap<(String, Labels), f64>,
}

impl Exposition {
    /// The samples named `name`, keyed by their labels.
    pub fn series(&self, name: &str) -> BTreeMap<Labels, f64> {
        self.samples
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, l), v)| (l.clone(), *v))
            .collect()
    }

    /// The value of `name{labels}`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .get(&(name.to_owned(), labels_of(labels)))
            .copied()
    }
}

/// Builds a label set.
pub fn labels_of(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s
            .parse::<f64>()
            .map_err(|e| format!("bad value `{s}`: {e}")),
    }
}

fn parse_labels(s: &str) -> Result<Labels, String> {
    let mut labels = Labels::new();
    let mut rest = s;
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("label without `=` in `{s}`"))?;
        let name = &rest[..eq];
        if !valid_name(name) {
            return Err(format!("bad label name `{name}`"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or_else(|| format!("label value not quoted in `{s}`"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    other => return Err(format!("bad escape {other:?} in `{s}`")),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err(format!("unterminated label value in `{s}`")),
            }
        };
        if labels.insert(name.to_owned(), value).is_some() {
            return Err(format!("label `{name}` twice in `{s}`"));
        }
        rest = &rest[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    Ok(labels)
}

/// Parses and checks `text`.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut exp = Exposition::default();
    for (n, line) in text.lines().enumerate() {
        let ctx = |e: String| format!("line {}: {e}: `{line}`", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(ctx(format!("unknown type `{kind}`")));
                    }
                    if exp.types.insert(name.to_owned(), kind.to_owned()).is_some() {
                        return Err(ctx("TYPE declared twice".into()));
                    }
                }
                (Some("HELP"), Some(name), help) => {
                    exp.help
                        .insert(name.to_owned(), help.unwrap_or("").to_owned());
                }
                _ => {}
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name_labels, value) = match line.rfind(' ') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => return Err(ctx("no value".into())),
        };
        let value = parse_value(value).map_err(ctx)?;
        let (name, labels) = match name_labels.find('{') {
            Some(i) => {
                let inner = name_labels[i + 1..]
                    .strip_suffix('}')
                    .ok_or_else(|| ctx("unclosed `{`".into()))?;
                (&name_labels[..i], parse_labels(inner).map_err(ctx)?)
            }
            None => (name_labels, Labels::new()),
        };
        if !valid_name(name) {
            return Err(ctx(format!("bad metric name `{name}`")));
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s).filter(|f| {
                    exp.types
                        .get(*f)
                        .is_some_and(|t| t == "histogram" || t == "summary")
                })
            })
            .unwrap_or(name);
        if !exp.types.contains_key(family) {
            return Err(ctx(format!("sample of undeclared family `{family}`")));
        }
        if exp
            .samples
            .insert((name.to_owned(), labels), value)
            .is_some()
        {
            return Err(ctx("duplicate sample".into()));
        }
    }
    check_histograms(&exp)?;
    Ok(exp)
}

fn check_histograms(exp: &Exposition) -> Result<(), String> {
    for (family, kind) in &exp.types {
        if kind != "histogram" {
            continue;
        }
        let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
        for (labels, v) in exp.series(&format!("{family}_bucket")) {
            let mut base = labels.clone();
            let le = base.remove("le").ok_or("bucket without `le`")?;
            series.entry(base).or_default().push((parse_value(&le)?, v));
        }
        for (base, mut buckets) in series {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{family}{base:?}: buckets not cumulative"));
            }
            let last = buckets.last().ok_or("no bucket")?;
            if last.0 != f64::INFINITY {
                return Err(format!("{family}{base:?}: no +Inf bucket"));
            }
            let count = exp.samples.get(&(format!("{family}_count"), base.clone()));
            if count != Some(&last.1) {
                return Err(format!(
                    "{family}{base:?}: +Inf bucket {} != _count {count:?}",
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
    Ok(())
}

/// The successful calls of `tool` an exposition counts (`tool_duration_seconds_count`
/// with `status="success"`); `None` when `text` does not parse or has no such series.
pub fn successes(text: &str, tool: &str) -> Option<f64> {
    parse(text).ok()?.value(
        "tool_duration_seconds_count",
        &[("tool", tool), ("status", "success")],
    )
}

/// The metrics layer of tool `weather`, recording into `exporter`, around the bare tool.
pub fn metered(
    exporter: &toolshield_metrics::PrometheusExporter,
) -> toolshield_metrics::Metrics<toolshield_test::BareTool> {
    use tower::Layer;
    toolshield_metrics::MetricsLayer::build(
        toolshield_metrics::MetricsConfig::with_tools(["weather"]),
        exporter.target(),
    )
    .unwrap()
    .layer(toolshield_test::BareTool)
}
