//! Idempotency keys: given, scoped by caller, or derived.

use std::fmt::Write as _;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use toolshield_core::{ToolError, ToolRequest};

/// The storage key of a record: `idemp:{tool}:key`. The braces are a Redis Cluster hash
/// tag, so every record of one tool lives in one slot.
///
/// ```
/// assert_eq!(toolshield_idempotency::storage_key("pay", "k1"), "idemp:{pay}:k1");
/// ```
pub fn storage_key(tool: &str, key: &str) -> String {
    let mut s = String::with_capacity(9 + tool.len() + key.len());
    s.push_str("idemp:{");
    s.push_str(tool);
    s.push_str("}:");
    s.push_str(key);
    s
}

/// The derived key of seed 001: hex sha256 of tool, canonical payload digest, caller and
/// the index of the time window `window` that `started_at` falls in.
pub fn derive_key(req: &ToolRequest, window: Duration) -> Result<String, ToolError> {
    let digest = req.payload_digest()?;
    let secs = req.meta().started_at.timestamp().max(0) as u64;
    let index = secs / window.as_secs().max(1);
    let mut h = Sha256::new();
    h.update(req.tool().as_bytes());
    h.update([0u8]);
    h.update(digest.as_bytes());
    h.update([0u8]);
    h.update(req.meta().caller_id.as_deref().unwrap_or("").as_bytes());
    h.update([0u8]);
    h.update(index.to_be_bytes());
    Ok(hex::encode(h.finalize()))
}

/// How a request's key was resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolvedKey {
    /// The key as the layer uses it (scoped by caller when given and configured).
    pub(crate) key: String,
    /// Whether it was derived (and so must be attached to the request).
    pub(crate) derived: bool,
}

pub(crate) fn resolve(
    req: &ToolRequest,
    derive: bool,
    window: Duration,
    scope_by_caller: bool,
) -> Result<Option<ResolvedKey>, ToolError> {
    match req.get_idempotency_key() {
        Some(given) => {
            let key = match (scope_by_caller, req.meta().caller_id.as_deref()) {
                (true, Some(caller)) => {
                    let mut k = String::with_capacity(caller.len() + 1 + given.len());
                    let _ = write!(k, "{caller}/{given}");
                    k
                }
                _ => given.to_owned(),
            };
            Ok(Some(ResolvedKey {
                key,
                derived: false,
            }))
        }
        None if derive => Ok(Some(ResolvedKey {
            key: derive_key(req, window)?,
            derived: true,
        })),
        None => Ok(None),
    }
}
