//! [`MemoryBounds`]: the size limits of an in-memory store.

use toolshield_contract::config::{ConfigError, Problems};

/// The bounds of an in-memory store: at most `max_entries` entries and about `max_bytes`
/// bytes (each entry weighs what its store says: its key plus its value's size).
///
/// ```
/// use toolshield_store::MemoryBounds;
///
/// assert!(MemoryBounds::new(1_000, 1 << 20).validate().is_ok());
/// let err = MemoryBounds::new(0, 10).validate().unwrap_err();
/// assert!(err.to_string().contains("max_entries"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct MemoryBounds {
    /// At most this many entries.
    pub max_entries: u64,
    /// At most about this many bytes.
    pub max_bytes: u64,
}

impl Default for MemoryBounds {
    /// 10,000 entries, 64 MiB (each store documents its own default).
    fn default() -> Self {
        MemoryBounds::new(10_000, 64 * 1024 * 1024)
    }
}

impl MemoryBounds {
    /// Bounds of `max_entries` entries and `max_bytes` bytes.
    pub const fn new(max_entries: u64, max_bytes: u64) -> Self {
        MemoryBounds {
            max_entries,
            max_bytes,
        }
    }

    /// Every problem: both bounds at least 1, and `max_bytes >= max_entries`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.check(self.max_entries >= 1, "max_entries", "must be at least 1");
        p.check(self.max_bytes >= 1, "max_bytes", "must be at least 1");
        p.check(
            self.max_bytes >= self.max_entries,
            "max_bytes",
            format_args!(
                "must be at least max_entries ({} < {})",
                self.max_bytes, self.max_entries
            ),
        );
        p.into_result()
    }
}
