//! [`FallbackStats`]: hand-over counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Hand-overs counted per tier, shared by every service built from one [`FallbackLayer`](crate::FallbackLayer);
/// `toolshield-metrics` exports them as `tool_fallback_handovers_total{tool,tier}`.
#[derive(Debug, Default)]
pub struct FallbackStats {
    pub(crate) tiers: Vec<(Arc<str>, AtomicU64)>,
    pub(crate) exhausted: AtomicU64,
    pub(crate) escalations: AtomicU64,
}

impl FallbackStats {
    /// `(tier, calls handed to it)`, in chain order.
    pub fn hand_overs(&self) -> Vec<(Arc<str>, u64)> {
        self.tiers
            .iter()
            .map(|(name, n)| (name.clone(), n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Calls where every tier failed.
    pub fn exhausted(&self) -> u64 {
        self.exhausted.load(Ordering::Relaxed)
    }

    /// Calls handed to the escalation hook.
    pub fn escalations(&self) -> u64 {
        self.escalations.load(Ordering::Relaxed)
    }
}
