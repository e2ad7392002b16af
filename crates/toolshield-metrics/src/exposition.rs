//! Families that collectors render themselves, merged so the exposition names each
//! family once: several collectors may render the same family (one breaker collector per
//! registry, for instance), and the text format allows one `# HELP` and one `# TYPE` per
//! family, before its samples, and each series once.

use std::collections::HashMap;
use std::fmt::Write as _;

use metrics::{Key, Label};

/// Appends `value` escaped as a label value of the text format: `\\`, `\"` and `\n` for a
/// backslash, a quote and a line feed, every other character as is (an injective escape:
/// two values are written alike only when they are equal). For collectors that render
/// families of their own.
pub fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `key` as it must reach the Prometheus recorder for its label values to be rendered
/// exactly: that recorder's escaper takes a backslash followed by a backslash, a quote or
/// a line feed for an escape already made and drops or merges it, so two different
/// values (`a\"b` and `a"b`, or `a\\b` and `a\b`) would be written as one series.
/// Each backslash doubled, it writes the exact escape of the original. `None` when no
/// label value has a backslash (the key is passed on as is). Called when a series is
/// registered, never per sample.
pub(crate) fn recorder_key(key: &Key) -> Option<Key> {
    if !key.labels().any(|l| l.value().contains('\\')) {
        return None;
    }
    let labels: Vec<Label> = key
        .labels()
        .map(|l| {
            let value = l.value();
            if value.contains('\\') {
                Label::new(l.key().to_owned(), value.replace('\\', "\\\\"))
            } else {
                l.clone()
            }
        })
        .collect();
    Some(Key::from_parts(key.name().to_owned(), labels))
}

/// A sample value: summed with another one of the same series.
#[derive(Clone, Copy)]
enum Sample<'a> {
    Int(u64),
    Float(f64),
    /// Not a number this merge can add: the first one written is kept.
    Text(&'a str),
}

impl<'a> Sample<'a> {
    fn parse(text: &'a str) -> Self {
        if let Ok(n) = text.parse::<u64>() {
            Sample::Int(n)
        } else if let Ok(f) = text.parse::<f64>() {
            Sample::Float(f)
        } else {
            Sample::Text(text)
        }
    }

    fn float(self) -> Option<f64> {
        match self {
            Sample::Int(n) => Some(n as f64),
            Sample::Float(f) => Some(f),
            Sample::Text(_) => None,
        }
    }

    fn add(self, other: Sample<'a>) -> Sample<'a> {
        match (self, other) {
            (Sample::Int(a), Sample::Int(b)) => Sample::Int(a.saturating_add(b)),
            (a, b) => match (a.float(), b.float()) {
                (Some(a), Some(b)) => Sample::Float(a + b),
                _ => a,
            },
        }
    }

    fn write(self, out: &mut String) {
        let _ = match self {
            Sample::Int(n) => write!(out, "{n}"),
            Sample::Float(f) if f.is_nan() => write!(out, "NaN"),
            Sample::Float(f) if f.is_infinite() => {
                write!(out, "{}", if f > 0.0 { "+Inf" } else { "-Inf" })
            }
            Sample::Float(f) => write!(out, "{f}"),
            Sample::Text(t) => write!(out, "{t}"),
        };
    }
}

/// One family: its header lines and its series in the order first written.
#[derive(Default)]
struct Family<'a> {
    help: Option<&'a str>,
    kind: Option<&'a str>,
    series: Vec<(&'a str, Sample<'a>)>,
    index: HashMap<&'a str, usize>,
}

/// Appends the families of `text` to `out`, each once: its first `# HELP` and `# TYPE`
/// lines, then its series in the order first written, a series written more than once
/// (by several collectors) with the sum of its values. Families keep the order they
/// first appear in; other comments are dropped.
pub(crate) fn merge_families(text: &str, out: &mut String) {
    let mut order: Vec<&str> = Vec::new();
    let mut families: HashMap<&str, Family<'_>> = HashMap::new();
    let mut current: Option<&str> = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let header = line
            .strip_prefix("# HELP ")
            .map(|rest| (rest, true))
            .or_else(|| line.strip_prefix("# TYPE ").map(|rest| (rest, false)));
        if let Some((rest, is_help)) = header {
            let name = rest.split(' ').next().unwrap_or(rest);
            let f = entry(&mut families, &mut order, name);
            if is_help {
                f.help.get_or_insert(line);
            } else {
                f.kind.get_or_insert(line);
            }
            current = Some(name);
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let Some((id, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = id.split('{').next().unwrap_or(id);
        let own = current.filter(|f| {
            name.strip_prefix(f)
                .is_some_and(|s| matches!(s, "" | "_bucket" | "_sum" | "_count"))
        });
        let f = entry(&mut families, &mut order, own.unwrap_or(name));
        let value = Sample::parse(value);
        match f.index.get(id) {
            Some(&i) => {
                if let Some(s) = f.series.get_mut(i) {
                    s.1 = s.1.add(value);
                }
            }
            None => {
                f.index.insert(id, f.series.len());
                f.series.push((id, value));
            }
        }
    }
    for name in order {
        let Some(f) = families.get(name) else {
            continue;
        };
        if f.series.is_empty() {
            continue;
        }
        for line in [f.help, f.kind].into_iter().flatten() {
            out.push_str(line);
            out.push('\n');
        }
        for (id, value) in &f.series {
            out.push_str(id);
            out.push(' ');
            value.write(out);
            out.push('\n');
        }
        out.push('\n');
    }
}

fn entry<'a, 'm>(
    families: &'m mut HashMap<&'a str, Family<'a>>,
    order: &mut Vec<&'a str>,
    name: &'a str,
) -> &'m mut Family<'a> {
    families.entry(name).or_insert_with(|| {
        order.push(name);
        Family::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(text: &str) -> String {
        let mut out = String::new();
        merge_families(text, &mut out);
        out
    }

    #[test]
    fn a_family_rendered_twice_is_written_once_with_duplicate_series_summed() {
        let text = "# HELP g A gauge.\n# TYPE g gauge\ng{key=\"a\"} 1\ng{key=\"other\"} 2\n\n\
                    # HELP c A counter.\n# TYPE c counter\nc{key=\"a\"} 5\n\n\
                    # HELP g A gauge.\n# TYPE g gauge\ng{key=\"b\"} 1\ng{key=\"other\"} 3\n\n";
        assert_eq!(
            merged(text),
            "# HELP g A gauge.\n# TYPE g gauge\ng{key=\"a\"} 1\ng{key=\"other\"} 5\n\
             g{key=\"b\"} 1\n\n# HELP c A counter.\n# TYPE c counter\nc{key=\"a\"} 5\n\n"
        );
    }

    #[test]
    fn label_values_with_spaces_and_escapes_stay_whole() {
        let text = "# TYPE g gauge\ng{key=\"a b \\\" \\n c\"} 1\ng{key=\"a b \\\" \\n c\"} 2.5\n";
        assert_eq!(
            merged(text),
            "# TYPE g gauge\ng{key=\"a b \\\" \\n c\"} 3.5\n\n"
        );
    }

    #[test]
    fn nothing_is_written_for_nothing() {
        assert_eq!(merged(""), "");
        assert_eq!(merged("# HELP g A gauge.\n# TYPE g gauge\n\n"), "");
    }
}
