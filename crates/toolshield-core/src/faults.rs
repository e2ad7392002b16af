//! Fault scripts for store wrappers (feature `testing`).
//!
//! A [`FaultPlan`] decides, operation by operation, what a faulty store wrapper does
//! instead of (or besides) passing the call through: fail it, delay it, let it take effect
//! and then report an error (a timeout after the request left), let it take effect *later*
//! while reporting an error at once (a write that lands when a paused server resumes), or
//! hang. The idempotency and cache crates wrap their store traits with it
//! (`testing::FaultyStore`, `testing::FaultyCacheStore`), so a third-party store gets the
//! same fault tests as the built-in ones.
//!
//! A plan is scripted (`once`, `nth`, `always`) or random with a seed (`random`), and the
//! two mix: scripted faults are consulted first. Clones share the plan.
//!
//! ```
//! use std::time::Duration;
//! use toolshield_core::faults::{Fault, FaultPlan};
//!
//! let plan = FaultPlan::new();
//! plan.once("complete", Fault::Fail);
//! plan.always("renew", Fault::Delay(Duration::from_millis(5)));
//! assert_eq!(plan.next("claim"), None);
//! assert_eq!(plan.next("complete"), Some(Fault::Fail));
//! assert_eq!(plan.next("complete"), None);
//! assert_eq!(plan.next("renew"), Some(Fault::Delay(Duration::from_millis(5))));
//! assert_eq!(plan.injected(), 2);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What happens to one store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Not performed; the operation reports an error.
    Fail,
    /// Performed after waiting this long (tokio time).
    Delay(Duration),
    /// Performed, then reported as an error (the reply was lost: a timeout after send).
    ApplyThenFail,
    /// Reported as an error at once, and performed this long afterwards in the
    /// background (a write still on the wire that lands when the server resumes).
    ApplyLater(Duration),
    /// Never answers (the caller's own timeout or drop ends it); not performed.
    Hang,
}

#[derive(Debug, Clone)]
struct Rule {
    op: String,
    /// Calls of `op` still to let through before this rule fires.
    skip: u64,
    /// How many more times it fires (`u64::MAX`: always).
    times: u64,
    fault: Fault,
}

#[derive(Debug, Default)]
struct Random {
    state: u64,
    rate: f64,
    faults: Vec<Fault>,
    ops: Vec<String>,
}

#[derive(Debug, Default)]
struct Inner {
    rules: Vec<Rule>,
    random: Option<Random>,
}

/// A script of faults, shared by clones (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    inner: Arc<Mutex<Inner>>,
    injected: Arc<AtomicU64>,
    down: Arc<std::sync::atomic::AtomicBool>,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl FaultPlan {
    /// A plan that injects nothing.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, op: &str, skip: u64, times: u64, fault: Fault) -> &Self {
        self.lock().rules.push(Rule {
            op: op.to_owned(),
            skip,
            times,
            fault,
        });
        self
    }

    /// The next call of `op` gets `fault`.
    pub fn once(&self, op: &str, fault: Fault) -> &Self {
        self.push(op, 0, 1, fault)
    }

    /// The `n`-th call of `op` from now (0 is the next one) gets `fault`.
    pub fn nth(&self, op: &str, n: u64, fault: Fault) -> &Self {
        self.push(op, n, 1, fault)
    }

    /// Every call of `op` gets `fault` until [`clear`](Self::clear).
    pub fn always(&self, op: &str, fault: Fault) -> &Self {
        self.push(op, 0, u64::MAX, fault)
    }

    /// Besides the scripted faults, each call of one of `ops` (every operation when empty)
    /// gets, with probability `rate`, one of `faults` picked at random; reproducible for a
    /// given `seed` and call order.
    pub fn random(&self, seed: u64, rate: f64, ops: &[&str], faults: &[Fault]) -> &Self {
        self.lock().random = Some(Random {
            state: seed,
            rate: rate.clamp(0.0, 1.0),
            faults: faults.to_vec(),
            ops: ops.iter().map(|s| (*s).to_owned()).collect(),
        });
        self
    }

    /// Removes every scripted and random fault.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.rules.clear();
        inner.random = None;
    }

    /// Starts (`true`) or ends (`false`) an outage: while it lasts every operation fails,
    /// whatever the script says.
    pub fn outage(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The fault for this call of `op`, if any (called by store wrappers once per
    /// operation).
    pub fn next(&self, op: &str) -> Option<Fault> {
        if self.down.load(Ordering::SeqCst) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Some(Fault::Fail);
        }
        let mut inner = self.lock();
        let mut found = None;
        for rule in inner.rules.iter_mut().filter(|r| r.op == op) {
            if rule.skip > 0 {
                rule.skip -= 1;
                continue;
            }
            if rule.times > 0 && found.is_none() {
                if rule.times != u64::MAX {
                    rule.times -= 1;
                }
                found = Some(rule.fault);
            }
        }
        inner.rules.retain(|r| r.times > 0);
        if found.is_none() {
            if let Some(r) = inner.random.as_mut() {
                if !r.faults.is_empty() && (r.ops.is_empty() || r.ops.iter().any(|o| o == op)) {
                    let roll = (splitmix(&mut r.state) >> 11) as f64 / (1u64 << 53) as f64;
                    if roll < r.rate {
                        let i = (splitmix(&mut r.state) % r.faults.len() as u64) as usize;
                        found = Some(r.faults[i]);
                    }
                }
            }
        }
        if found.is_some() {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_skips_the_calls_before_it() {
        let plan = FaultPlan::new();
        plan.nth("get", 2, Fault::Fail);
        assert_eq!(plan.next("get"), None);
        assert_eq!(plan.next("get"), None);
        assert_eq!(plan.next("get"), Some(Fault::Fail));
        assert_eq!(plan.next("get"), None);
    }

    #[test]
    fn random_faults_are_reproducible_and_near_the_rate() {
        let run = |seed| {
            let plan = FaultPlan::new();
            plan.random(seed, 0.25, &["claim"], &[Fault::Fail, Fault::ApplyThenFail]);
            (0..4000).map(|_| plan.next("claim")).collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        let hits = a.iter().filter(|f| f.is_some()).count();
        assert!(
            (800..1200).contains(&hits),
            "{hits} faults in 4000 at rate 0.25"
        );
        let plan = FaultPlan::new();
        plan.random(7, 1.0, &["claim"], &[Fault::Fail]);
        assert_eq!(
            plan.next("get"),
            None,
            "ops outside the list are left alone"
        );
    }
}
