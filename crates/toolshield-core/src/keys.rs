//! Storage keys and tool names: one injective encoding shared by every store.
//!
//! A storage key is built from a namespace chosen by the store (`idemp`, `cache`), the
//! tool name, an optional scope (the caller) and a key (an idempotency key, a digest):
//!
//! ```text
//! {namespace}:{<tool, escaped>}:-:<key>                    no scope
//! {namespace}:{<tool, escaped>}:s<len>:<scope>:<key>       scope of <len> bytes
//! ```
//!
//! The encoding is injective: the tool is escaped so it cannot contain `}` (its braces
//! are also a Redis Cluster hash tag, so every key of one tool lives in one slot), the
//! scope is length-prefixed so nothing it contains can move the boundary, and a call
//! without a scope has its own marker (`-`) that no scoped key starts with. No two
//! distinct `(tool, scope, key)` triples share a storage key, whatever the caller and key
//! contain.
//!
//! ```
//! use toolshield_core::keys::storage_key;
//!
//! assert_eq!(storage_key("idemp", "pay", None, "order-1"), "idemp:{pay}:-:order-1");
//! assert_eq!(storage_key("idemp", "pay", Some("alice"), "order-1"), "idemp:{pay}:s5:alice:order-1");
//! // A caller-less key that looks scoped is not Alice's key.
//! assert_ne!(
//!     storage_key("idemp", "pay", None, "alice/order-1"),
//!     storage_key("idemp", "pay", Some("alice"), "order-1"),
//! );
//! ```

use std::fmt::Write as _;

/// The longest tool name accepted by [`check_tool_name`].
pub const MAX_TOOL_NAME_LEN: usize = 256;

/// Appends `tool` with `%`, `{` and `}` percent-encoded (and control characters), so the
/// result never contains a brace and decodes to exactly one name.
fn push_escaped(out: &mut String, tool: &str) {
    // The common name (printable ASCII without `%` or braces) needs no escape: copied
    // whole. For ASCII, the control characters are exactly the bytes below 0x20 and 0x7F.
    if tool
        .bytes()
        .all(|b| matches!(b, 0x20..=0x7e) && !matches!(b, b'%' | b'{' | b'}'))
    {
        out.push_str(tool);
        return;
    }
    for c in tool.chars() {
        match c {
            '%' | '{' | '}' => {
                let _ = write!(out, "%{:02X}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "%u{:X};", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// The storage key of `(tool, scope, key)` under `namespace` (see the module docs).
pub fn storage_key(namespace: &str, tool: &str, scope: Option<&str>, key: &str) -> String {
    let scope_len = scope.map_or(2, |s| s.len() + 24);
    let mut s = String::with_capacity(namespace.len() + tool.len() + scope_len + key.len() + 6);
    s.push_str(namespace);
    s.push_str(":{");
    push_escaped(&mut s, tool);
    s.push_str("}:");
    match scope {
        None => s.push_str("-:"),
        Some(scope) => {
            let _ = write!(s, "s{}:", scope.len());
            s.push_str(scope);
            s.push(':');
        }
    }
    s.push_str(key);
    s
}

/// Why a tool name is refused, or `None` when it is acceptable: not blank, at most
/// [`MAX_TOOL_NAME_LEN`] bytes, no braces (they delimit the Redis hash tag), none of the
/// characters [`breaks_a_line`](crate::breaks_a_line) names (control characters, line
/// separators, bidirectional controls, invisible spaces, tag characters: a name shows in
/// logs, metrics, admin answers and texts for a model, and must read there as it is) and
/// no surrounding whitespace.
///
/// ```
/// use toolshield_core::keys::check_tool_name;
///
/// assert!(check_tool_name("get_weather").is_none());
/// assert!(check_tool_name("a}:b").is_some());
/// assert!(check_tool_name("line\nbreak").is_some());
/// assert!(check_tool_name("pay\u{202e}tnemyap").is_some());
/// ```
pub fn check_tool_name(name: &str) -> Option<String> {
    if name.trim().is_empty() {
        return Some("a tool name must not be blank".into());
    }
    if name.len() > MAX_TOOL_NAME_LEN {
        return Some(format!(
            "a tool name is at most {MAX_TOOL_NAME_LEN} bytes (got {})",
            name.len()
        ));
    }
    if name.trim() != name {
        return Some("a tool name must not start or end with whitespace".into());
    }
    if let Some(c) = name
        .chars()
        .find(|&c| matches!(c, '{' | '}') || crate::breaks_a_line(c))
    {
        return Some(format!(
            "a tool name must not contain {c:?} (braces, control characters and characters \
             that break a line or reorder or hide text are reserved)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn part() -> impl Strategy<Value = String> {
        // Short strings over an alphabet rich in the separators the encoding must survive.
        proptest::collection::vec(
            prop_oneof![
                Just('a'),
                Just('b'),
                Just(':'),
                Just('/'),
                Just('{'),
                Just('}'),
                Just('%'),
                Just('-'),
                Just('s'),
                Just('1'),
                Just('\n'),
                Just('é'),
            ],
            0..6,
        )
        .prop_map(|v| v.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn distinct_triples_never_share_a_storage_key(
            t1 in part(), s1 in proptest::option::of(part()), k1 in part(),
            t2 in part(), s2 in proptest::option::of(part()), k2 in part(),
        ) {
            let a = storage_key("idemp", &t1, s1.as_deref(), &k1);
            let b = storage_key("idemp", &t2, s2.as_deref(), &k2);
            if (t1, s1, k1) != (t2, s2, k2) {
                prop_assert_ne!(a, b);
            } else {
                prop_assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn the_hash_tag_is_the_escaped_tool() {
        let k = storage_key("cache", "a}:b", Some("c"), "d");
        let open = k.find('{').unwrap();
        let close = k.find('}').unwrap();
        assert_eq!(&k[open + 1..close], "a%7D:b");
    }

    #[test]
    fn reported_collisions_are_gone() {
        // Caller `b}:c` on tool `a` against tool `a}:b` with caller `c`.
        assert_ne!(
            storage_key("cache", "a", Some("b}:c"), "x"),
            storage_key("cache", "a}:b", Some("c"), "x")
        );
        // Callers `acme` + key `bot/order-9` against `acme/bot` + key `order-9`.
        assert_ne!(
            storage_key("idemp", "pay", Some("acme"), "bot/order-9"),
            storage_key("idemp", "pay", Some("acme/bot"), "order-9")
        );
    }
}
