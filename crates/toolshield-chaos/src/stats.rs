use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The kinds of fault the layer injects, the `fault` label of its metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// A delay before the tool is called.
    Latency,
    /// An error instead of the call.
    Error,
    /// No answer until cancelled.
    Hang,
    /// A response carrying an in-band failure instead of the call.
    InBand,
}

impl FaultKind {
    /// Every kind, in label order.
    pub const ALL: [FaultKind; 4] = [
        FaultKind::Latency,
        FaultKind::Error,
        FaultKind::Hang,
        FaultKind::InBand,
    ];

    /// The stable label (`latency`, `error`, `hang`, `in_band`).
    pub const fn as_str(self) -> &'static str {
        match self {
            FaultKind::Latency => "latency",
            FaultKind::Error => "error",
            FaultKind::Hang => "hang",
            FaultKind::InBand => "in_band",
        }
    }

    const fn index(self) -> usize {
        match self {
            FaultKind::Latency => 0,
            FaultKind::Error => 1,
            FaultKind::Hang => 2,
            FaultKind::InBand => 3,
        }
    }
}

/// Whether one tool's fault injection is on, and how many faults it injected: what the
/// `toolshield_faults_injected_total{tool,fault}` counter and the
/// `toolshield_fault_injection_enabled{tool}` gauge export, so injection left on cannot
/// go unnoticed.
pub struct ChaosStats {
    tool: Arc<str>,
    enabled: bool,
    injected: [AtomicU64; 4],
}

impl ChaosStats {
    pub(crate) fn new(tool: Arc<str>, enabled: bool) -> Self {
        ChaosStats {
            tool,
            enabled,
            injected: Default::default(),
        }
    }

    /// The stats of a tool with no fault injection (the gauge reads 0).
    #[must_use]
    pub fn disabled(tool: impl Into<Arc<str>>) -> Arc<Self> {
        Arc::new(Self::new(tool.into(), false))
    }

    /// The tool the layer was built for (empty when unnamed).
    pub fn tool(&self) -> &Arc<str> {
        &self.tool
    }

    /// Whether faults are being injected.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Faults of `kind` injected so far.
    pub fn injected(&self, kind: FaultKind) -> u64 {
        self.injected[kind.index()].load(Ordering::Relaxed)
    }

    /// Faults of every kind injected so far.
    pub fn total(&self) -> u64 {
        FaultKind::ALL.iter().map(|k| self.injected(*k)).sum()
    }

    pub(crate) fn count(&self, kind: FaultKind) {
        self.injected[kind.index()].fetch_add(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for ChaosStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ChaosStats");
        d.field("tool", &self.tool).field("enabled", &self.enabled);
        for kind in FaultKind::ALL {
            d.field(kind.as_str(), &self.injected(kind));
        }
        d.finish()
    }
}
