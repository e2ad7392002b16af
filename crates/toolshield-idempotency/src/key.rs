//! Idempotency keys: given, scoped by caller, or derived.

use std::borrow::Cow;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use toolshield_core::{idempotency_key_of, Digest, ToolError, ToolRequest};

/// The storage key of a record: `idemp:{tool}:<scope>:<kind>:<key>`, built with the one
/// injective encoding of [`toolshield_core::keys::storage_key`]: the caller (`scope`) is
/// length-prefixed, a call without one has its own namespace (`-`), and given keys (`g:`)
/// never share a record with derived ones (`d:`). The braces are a Redis Cluster hash tag,
/// so every record of one tool lives in one slot.
///
/// ```
/// use toolshield_idempotency::storage_key;
///
/// assert_eq!(storage_key("pay", Some("alice"), "order-1"), "idemp:{pay}:s5:alice:g:order-1");
/// assert_eq!(storage_key("pay", None, "order-1"), "idemp:{pay}:-:g:order-1");
/// // A caller-less key that looks like Alice's is not Alice's.
/// assert_ne!(storage_key("pay", None, "alice/order-1"), storage_key("pay", Some("alice"), "order-1"));
/// // Whitespace around a key is not part of it, as for the layer.
/// assert_eq!(storage_key("pay", None, " order-1\t"), storage_key("pay", None, "order-1"));
/// ```
pub fn storage_key(tool: &str, caller: Option<&str>, key: &str) -> String {
    encode(tool, caller, KeySource::Given, key.trim())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeySource {
    Given,
    Derived,
}

fn encode(tool: &str, caller: Option<&str>, source: KeySource, key: &str) -> String {
    // The shared encoding with an empty key, then `g:` or `d:` and the key: the same bytes
    // as passing `g:<key>` as the key, without building that string first.
    let mut k = toolshield_core::keys::storage_key("idemp", tool, caller, "");
    k.reserve(2 + key.len());
    k.push_str(match source {
        KeySource::Given => "g:",
        KeySource::Derived => "d:",
    });
    k.push_str(key);
    k
}

/// The derived key: hex sha256 of tool, payload fingerprint (the canonical payload digest,
/// telling apart integers beyond 2^53 as well), caller and the index of the time window
/// `window` that `started_at` falls in.
pub fn derive_key(req: &ToolRequest, window: Duration) -> Result<String, ToolError> {
    let digest = fingerprint(req)?;
    let secs = req.meta().started_at.timestamp().max(0) as u64;
    let index = secs / window.as_secs().max(1);
    // Every variable-length part is length-prefixed, and an absent caller is told from an
    // empty one, so no two inputs hash the same bytes.
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    part(req.tool().as_bytes());
    part(digest.as_bytes());
    match req.meta().caller_id.as_deref() {
        Some(caller) => {
            part(b"caller");
            part(caller.as_bytes());
        }
        None => part(b"no caller"),
    }
    part(&index.to_be_bytes());
    Ok(hex::encode(h.finalize()))
}

/// The longest idempotency key accepted (as Stripe's): a longer one is `INVALID_INPUT`,
/// so a caller cannot make records (and Redis keys) of any size.
pub const MAX_KEY_LEN: usize = 255;

/// The longest caller id a record is scoped to: a longer one is `INVALID_INPUT` (when
/// keys are scoped by caller, the caller is part of the storage key), so a caller cannot
/// make Redis keys of any size. The budget's bound on run and caller ids is the same.
pub const MAX_CALLER_LEN: usize = 512;

/// Refuses, before any store is asked, a tool name, caller scope or key too long to be
/// part of a storage key. The message gives sizes, never the names.
pub(crate) fn check_key_parts(
    tool: &str,
    scope: Option<&str>,
    key: Option<&str>,
) -> Result<(), ToolError> {
    use toolshield_core::keys::MAX_TOOL_NAME_LEN;
    let too_long = |what: &str, max: usize, len: usize| {
        Err(ToolError::invalid_input(format!(
            "{what} is at most {max} bytes (got {len})"
        )))
    };
    if tool.len() > MAX_TOOL_NAME_LEN {
        return too_long("a tool name", MAX_TOOL_NAME_LEN, tool.len());
    }
    if let Some(scope) = scope.filter(|s| s.len() > MAX_CALLER_LEN) {
        return too_long("a caller id", MAX_CALLER_LEN, scope.len());
    }
    if let Some(key) = key.filter(|k| k.len() > MAX_KEY_LEN) {
        return too_long("an idempotency key", MAX_KEY_LEN, key.len());
    }
    Ok(())
}

/// How a request's key was resolved: borrowed from the request, except a derived key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolvedKey<'a> {
    /// The key itself: given by the caller, or derived.
    pub(crate) key: Cow<'a, str>,
    /// The caller it is scoped to (`None`: the namespace of calls without a caller, or
    /// scoping is off).
    pub(crate) scope: Option<&'a str>,
}

impl ResolvedKey<'_> {
    /// Whether it was derived (and so must be attached to the request).
    pub(crate) fn derived(&self) -> bool {
        matches!(self.key, Cow::Owned(_))
    }

    /// The record's storage key for `tool`.
    pub(crate) fn storage_key(&self, tool: &str) -> String {
        let source = if self.derived() {
            KeySource::Derived
        } else {
            KeySource::Given
        };
        encode(tool, self.scope, source, &self.key)
    }
}

pub(crate) fn resolve(
    req: &ToolRequest,
    derive: bool,
    window: Duration,
    scope_by_caller: bool,
) -> Result<Option<ResolvedKey<'_>>, ToolError> {
    let scope = if scope_by_caller {
        req.meta().caller_id.as_deref()
    } else {
        None
    };
    // A blank key is no key: it would make every keyless call of a tool one record.
    let given = idempotency_key_of(req);
    if given.is_some() || derive {
        check_key_parts(req.tool(), scope, given)?;
    }
    match given {
        Some(given) => Ok(Some(ResolvedKey {
            key: Cow::Borrowed(given),
            scope,
        })),
        None if derive => Ok(Some(ResolvedKey {
            key: Cow::Owned(derive_key(req, window)?),
            scope,
        })),
        None => Ok(None),
    }
}

/// The magnitude up to which every integer has a double of its own (2^53).
const EXACT_UP_TO: u64 = 1 << 53;

/// The payload's fingerprint: its canonical digest (shared with the other layers), except
/// for a payload holding a number beyond 2^53 in magnitude. The canonical form writes
/// numbers as doubles (RFC 8785), so `9007199254740993` and `9007199254740992` have one
/// form: for a mutation those are two accounts, and one must never be deduped against, or
/// replay the result of, the other. Such a payload's fingerprint also hashes the exact
/// value of each of those numbers, in canonical (sorted key) order. Equal JSON values
/// still share one fingerprint (`1e2` and `100`, keys in any order).
pub(crate) fn fingerprint(req: &ToolRequest) -> Result<Digest, ToolError> {
    let digest = req.payload_digest()?;
    let payload = req.payload();
    if !has_large_number(payload) {
        return Ok(digest);
    }
    let mut bytes = Vec::with_capacity(64);
    bytes.extend_from_slice(b"exact integers\0");
    bytes.extend_from_slice(digest.as_bytes());
    exact_large_numbers(payload, &mut bytes);
    Ok(Digest::of_bytes(&bytes))
}

fn is_large(n: &serde_json::Number) -> bool {
    if let Some(u) = n.as_u64() {
        u > EXACT_UP_TO
    } else if let Some(i) = n.as_i64() {
        i.unsigned_abs() > EXACT_UP_TO
    } else {
        n.as_f64().is_some_and(|f| f.abs() > EXACT_UP_TO as f64)
    }
}

/// Whether `value` holds a number beyond 2^53 in magnitude (any order, no allocation).
fn has_large_number(value: &Value) -> bool {
    match value {
        Value::Number(n) => is_large(n),
        Value::Array(items) => items.iter().any(has_large_number),
        Value::Object(map) => map.values().any(has_large_number),
        _ => false,
    }
}

/// Appends the exact value of every number beyond 2^53 in `value`, in sorted key order,
/// each ended by `,`. A double that large is an integer: it is written as one (`2^60` as a
/// double and as an integer are the same JSON value, and the same text here).
fn exact_large_numbers(value: &Value, out: &mut Vec<u8>) {
    use std::io::Write as _;
    match value {
        Value::Number(n) if is_large(n) => {
            let _ = if let Some(u) = n.as_u64() {
                write!(out, "{u},")
            } else if let Some(i) = n.as_i64() {
                write!(out, "{i},")
            } else {
                let f = n.as_f64().unwrap_or_default();
                if f.abs() < 2f64.powi(127) {
                    // Integral (beyond 2^53) and within i128: exact.
                    write!(out, "{},", f as i128)
                } else {
                    write!(out, "f{:x},", f.to_bits())
                }
            };
        }
        Value::Array(items) => {
            for item in items {
                exact_large_numbers(item, out);
            }
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            for k in keys {
                if let Some(v) = map.get(k.as_str()) {
                    exact_large_numbers(v, out);
                }
            }
        }
        _ => {}
    }
}
