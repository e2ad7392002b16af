//! Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) and SHA-256 keys.
//!
//! Two payloads that mean the same JSON (keys in another order, `1.0` and `1`, other
//! whitespace) canonicalise to the same bytes and so to the same digest. serde_json's own
//! map order is never relied on.

use std::fmt;
use std::io;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::{ErrorKind, ToolError};

/// A SHA-256 digest, shown and serialised as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of raw bytes.
    pub fn of_bytes(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64-character lowercase hex form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the 64-character hex form.
    pub fn from_hex(s: &str) -> Option<Digest> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 64];
        // `encode_to_slice` only fails on a wrong buffer length, which is fixed here.
        if hex::encode_to_slice(self.0, &mut buf).is_err() {
            return Err(fmt::Error);
        }
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Digest::from_hex(&s).ok_or_else(|| serde::de::Error::custom("expected 64 hex characters"))
    }
}

/// Feeds the canonical bytes straight into the hasher: no intermediate buffer.
struct HashWriter(Sha256);

impl io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The RFC 8785 canonical form of a JSON value.
pub fn canonical_json(value: &Value) -> Result<String, ToolError> {
    serde_jcs::to_string(value).map_err(|e| ToolError::from_source(ErrorKind::InvalidInput, e))
}

/// SHA-256 of the canonical JSON of `value`.
///
/// Fails with `INVALID_INPUT` only for values RFC 8785 cannot represent.
pub fn payload_digest(value: &Value) -> Result<Digest, ToolError> {
    let mut w = HashWriter(Sha256::new());
    serde_jcs::to_writer(&mut w, value)
        .map_err(|e| ToolError::from_source(ErrorKind::InvalidInput, e))?;
    Ok(Digest(w.0.finalize().into()))
}

/// The cache key of a read-only call: `{tool}:{sha256(canonical payload)}`.
pub fn cache_key(tool: &str, payload: &Value) -> Result<String, ToolError> {
    Ok(cache_key_from_digest(tool, &payload_digest(payload)?))
}

/// The cache key from a digest already computed (see [`ToolRequest::payload_digest`](crate::ToolRequest::payload_digest)).
pub fn cache_key_from_digest(tool: &str, digest: &Digest) -> String {
    use fmt::Write as _;
    let mut key = String::with_capacity(tool.len() + 1 + 64);
    key.push_str(tool);
    key.push(':');
    // Writing into a String never fails.
    let _ = write!(key, "{digest}");
    key
}
