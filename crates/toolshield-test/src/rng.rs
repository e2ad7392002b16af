//! [`Rng`]: the deterministic generator of the randomized tests.

use std::time::Duration;

/// A small deterministic generator (xorshift64*): a randomized test replays the same plan
/// for a seed, with no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from `seed`, any value (0 included): the seed is spread over the state.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Starting from `state` as it is (not 0, which stays 0).
    #[must_use]
    pub fn from_state(state: u64) -> Self {
        Rng(state)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Up to `max` milliseconds, `max` included.
    pub fn millis(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.below(max.saturating_add(1)))
    }
}

/// How many seeds a randomized checker runs: the number in the environment variable
/// `var` (a long run sets it), else `default` (what CI runs).
///
/// ```
/// assert_eq!(toolshield_test::seeds_from_env("TOOLSHIELD_NO_SUCH_SEEDS", 16), 16);
/// ```
pub fn seeds_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
