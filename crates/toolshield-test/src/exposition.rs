//! A strict parser of the Prometheus text exposition format (0.0.4), for tests of what
//! `/metrics` serves: HELP and TYPE once per family and before its samples, every family's
//! lines in one group, metric and label names by the grammar, label values and HELP text
//! with only the allowed escapes, counters named `_total`, no series twice, histogram
//! buckets cumulative and ending with `+Inf` equal to `_count`, with a `_sum`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Labels of one sample, sorted by name.
pub type Labels = BTreeMap<String, String>;

/// One exposition, read strictly.
#[derive(Debug, Default)]
pub struct Exposition {
    /// Family name -> type.
    pub types: HashMap<String, String>,
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

    /// The values of `label` over the samples whose name starts with `family_prefix`.
    pub fn label_values(&self, family_prefix: &str, label: &str) -> BTreeSet<String> {
        self.samples
            .keys()
            .filter(|(n, _)| n.starts_with(family_prefix))
            .filter_map(|(_, l)| l.get(label).cloned())
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

/// Parses `text` and checks it; the first problem, with its line, as `Err`.
pub fn parse(text: &str) -> Result<Exposition, String> {
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
