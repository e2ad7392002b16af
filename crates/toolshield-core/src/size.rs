//! Sizes of values, for the in-memory stores that are bounded by bytes.

use std::io;

use serde::Serialize;
use serde_json::Value;

use crate::{Provenance, ToolResponse};

/// Counts the bytes serde writes, without buffering them.
struct Counter(usize);

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The length of `value` serialised as compact JSON, counted without buffering it; 0 if
/// it cannot be serialised.
pub fn serialized_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => 0,
    }
}

/// The length of `value` as compact JSON (what `serde_json::to_vec` would produce),
/// computed by walking it: nothing is formatted or allocated. Exact for everything but
/// floating-point numbers, which count the length of their shortest round-trip form.
///
/// ```
/// use serde_json::json;
/// use toolshield_core::size::json_len;
///
/// let v = json!({"city": "Paris", "temp": 21, "tags": ["a\n", null, true]});
/// assert_eq!(json_len(&v), serde_json::to_vec(&v).unwrap().len());
/// ```
pub fn json_len(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => number_len(n),
        Value::String(s) => string_len(s),
        Value::Array(items) => {
            // Brackets and the commas between items.
            2 + items.len().saturating_sub(1) + items.iter().map(json_len).sum::<usize>()
        }
        Value::Object(map) => {
            // Braces, a colon per member and the commas between members.
            2 + map.len()
                + map.len().saturating_sub(1)
                + map
                    .iter()
                    .map(|(k, v)| string_len(k) + json_len(v))
                    .sum::<usize>()
        }
    }
}

/// The in-memory weight of a response kept by a store: its output as compact JSON, the
/// provenance record and the strings it points to. Used by the bounded in-memory stores
/// instead of serialising the response on every write.
pub fn response_weight(response: &ToolResponse) -> usize {
    json_len(&response.output) + provenance_weight(&response.provenance)
}

fn provenance_weight(p: &Provenance) -> usize {
    let strings = [
        &p.source,
        &p.tool,
        &p.trace_id,
        &p.tier,
        &p.progress_message,
    ]
    .into_iter()
    .map(|s| s.as_ref().map_or(0, |s| s.len()))
    .sum::<usize>();
    std::mem::size_of::<Provenance>() + strings
}

fn number_len(n: &serde_json::Number) -> usize {
    if let Some(u) = n.as_u64() {
        digits(u)
    } else if let Some(i) = n.as_i64() {
        1 + digits(i.unsigned_abs())
    } else if let Some(f) = n.as_f64() {
        let mut buf = ryu_js::Buffer::new();
        buf.format_finite(f).len()
    } else {
        0
    }
}

fn digits(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

fn string_len(s: &str) -> usize {
    // Quotes, plus what serde_json's escaping adds: two bytes for `"`, `\` and the named
    // control characters, six (`\u00XX`) for the other control characters.
    2 + s.len()
        + s.bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\x08' | b'\x0c' | b'\n' | b'\r' | b'\t' => 1,
                0..=0x1f => 5,
                _ => 0,
            })
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_len_matches_serde_json() {
        let values = [
            json!(null),
            json!(false),
            json!(0),
            json!(-1),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(1.5),
            json!(-0.001),
            json!(1e300),
            json!(""),
            json!("tab\there \"quoted\" back\\slash \u{1} é ☃"),
            json!([]),
            json!({}),
            json!([1, [2, {"a": []}], {"b\n": {"c": null}}]),
        ];
        for v in values {
            assert_eq!(json_len(&v), serde_json::to_vec(&v).unwrap().len(), "{v}");
        }
    }

    #[test]
    fn serialized_len_counts_what_serde_writes() {
        let v = json!({"a": [1, 2, "three"]});
        assert_eq!(serialized_len(&v), serde_json::to_vec(&v).unwrap().len());
    }

    #[test]
    fn response_weight_grows_with_the_output_and_the_provenance() {
        let small = ToolResponse::new(json!(1));
        let big = ToolResponse::new(json!("x".repeat(1000)));
        assert!(response_weight(&big) >= response_weight(&small) + 1000);
        let mut tagged = ToolResponse::new(json!(1));
        tagged.provenance.source = Some("https://example.com/weather".into());
        assert_eq!(
            response_weight(&tagged),
            response_weight(&small) + "https://example.com/weather".len()
        );
    }
}
