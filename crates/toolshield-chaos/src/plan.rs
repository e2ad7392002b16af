//! The draw: which fault, if any, call number `n` gets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use toolshield_contract::config::MAX_DURATION;
use toolshield_contract::ErrorKind;

use crate::config::ChaosConfig;

/// What one call gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Wait this long, then call the tool.
    Latency(Duration),
    /// Fail with this kind (and `retry_after`), without calling the tool.
    Error(ErrorKind, Option<Duration>),
    /// Never answer until cancelled.
    Hang,
    /// Answer with an in-band failure of this kind.
    InBand(ErrorKind),
}

/// Draws are 53-bit fractions of the unit interval, compared with cumulative thresholds.
const SCALE: f64 = (1u64 << 53) as f64;

/// The faults with their cumulative thresholds, and the sequence counter.
#[derive(Debug)]
pub(crate) struct Plan {
    seed: u64,
    next: AtomicU64,
    slices: Vec<(u64, Fault)>,
}

impl Plan {
    pub(crate) fn new(cfg: &ChaosConfig, seed: u64) -> Self {
        let mut slices = Vec::new();
        let mut cumulative = 0.0f64;
        let mut push = |rate: f64, fault: Fault| {
            // Rates were validated; clamp anyway so a builder cannot make the draw wrap.
            let rate = if rate.is_finite() {
                rate.clamp(0.0, 1.0)
            } else {
                0.0
            };
            if rate > 0.0 {
                cumulative = (cumulative + rate).min(1.0);
                slices.push(((cumulative * SCALE) as u64, fault));
            }
        };
        if let Some(l) = cfg.latency {
            push(l.rate, Fault::Latency(l.delay.min(MAX_DURATION)));
        }
        for e in &cfg.error {
            push(
                e.rate,
                Fault::Error(e.kind, e.retry_after.map(|d| d.min(MAX_DURATION))),
            );
        }
        if let Some(h) = cfg.hang {
            push(h.rate, Fault::Hang);
        }
        if let Some(b) = cfg.in_band {
            push(b.rate, Fault::InBand(b.kind));
        }
        Plan {
            seed,
            next: AtomicU64::new(0),
            slices,
        }
    }

    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }

    /// The fault of the next call, in the order calls arrive.
    pub(crate) fn draw(&self) -> Option<Fault> {
        if self.slices.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let x = splitmix64(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 11;
        self.slices
            .iter()
            .find(|(threshold, _)| x < *threshold)
            .map(|(_, fault)| *fault)
    }
}

/// SplitMix64's finaliser: a well-mixed 64-bit value from each (seed, call number).
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
