//! The backoff strategies: nominal waits, jitter bounds over many seeds, and no panic
//! whatever the numbers.

use std::time::Duration;

use toolshield_retry::{Backoff, BackoffStrategy, Jitter};

const SEEDS: u64 = 10_000;
const MS: fn(u64) -> Duration = Duration::from_millis;

fn exp(jitter: Jitter) -> BackoffStrategy {
    BackoffStrategy::exponential(MS(500), 2.0, MS(5000), jitter)
}

/// Checks `lo <= wait <= hi` for every seed and that the waits cover the range.
fn check_bounds(b: &impl Backoff, retry: u32, previous: Duration, lo: Duration, hi: Duration) {
    let (mut min, mut max) = (Duration::MAX, Duration::ZERO);
    for seed in 0..SEEDS {
        let mut rng = fastrand::Rng::with_seed(seed);
        let w = b.wait(retry, previous, &mut rng);
        assert!(
            w >= lo && w <= hi,
            "seed {seed}: {w:?} outside [{lo:?}, {hi:?}]"
        );
        min = min.min(w);
        max = max.max(w);
    }
    let spread = hi - lo;
    if !spread.is_zero() {
        assert!(
            min - lo < spread / 20,
            "waits never near the low bound: {min:?}"
        );
        assert!(
            hi - max < spread / 20,
            "waits never near the high bound: {max:?}"
        );
    }
}

#[test]
fn full_jitter_stays_in_zero_to_nominal() {
    let b = exp(Jitter::Full);
    for (retry, nominal) in [
        (1, 500),
        (2, 1000),
        (3, 2000),
        (4, 4000),
        (5, 5000),
        (9, 5000),
    ] {
        check_bounds(&b, retry, Duration::ZERO, Duration::ZERO, MS(nominal));
    }
}

#[test]
fn equal_jitter_stays_in_half_to_nominal() {
    let b = exp(Jitter::Equal);
    for (retry, nominal) in [(1, 500), (2, 1000), (3, 2000), (4, 4000), (6, 5000)] {
        check_bounds(&b, retry, Duration::ZERO, MS(nominal / 2), MS(nominal));
    }
}

#[test]
fn no_jitter_is_exactly_nominal() {
    let b = exp(Jitter::None);
    let mut rng = fastrand::Rng::with_seed(1);
    let waits: Vec<_> = (1..=6)
        .map(|r| b.wait(r, Duration::ZERO, &mut rng))
        .collect();
    assert_eq!(waits, [500, 1000, 2000, 4000, 5000, 5000].map(MS));
}

#[test]
fn decorrelated_jitter_stays_between_base_and_three_times_previous_capped() {
    let b = BackoffStrategy::decorrelated(MS(100), MS(2000));
    check_bounds(&b, 1, Duration::ZERO, MS(100), MS(300));
    check_bounds(&b, 2, MS(300), MS(100), MS(900));
    // Capped: uniform[100, 3000] then min(cap), so every wait is at most 2 s.
    for seed in 0..SEEDS {
        let w = b.wait(3, MS(1000), &mut fastrand::Rng::with_seed(seed));
        assert!(w >= MS(100) && w <= MS(2000), "{w:?}");
    }
}

#[test]
fn fixed_range_stays_in_min_to_max() {
    let b = BackoffStrategy::fixed_range(MS(200), MS(500));
    for retry in 1..4 {
        check_bounds(&b, retry, MS(300), MS(200), MS(500));
    }
}

#[test]
fn none_is_zero() {
    let mut rng = fastrand::Rng::with_seed(7);
    assert_eq!(
        BackoffStrategy::none().wait(3, MS(10), &mut rng),
        Duration::ZERO
    );
}

#[test]
fn no_panic_whatever_the_numbers() {
    let weird = [
        BackoffStrategy::fixed_range(MS(900), MS(500)),
        BackoffStrategy::exponential(MS(500), 0.0, MS(5000), Jitter::Full),
        BackoffStrategy::exponential(MS(500), -3.0, MS(5000), Jitter::Equal),
        BackoffStrategy::exponential(MS(500), f64::NAN, MS(5000), Jitter::None),
        BackoffStrategy::exponential(MS(500), f64::INFINITY, MS(5000), Jitter::None),
        BackoffStrategy::exponential(Duration::MAX, 1e300, Duration::MAX, Jitter::Full),
        BackoffStrategy::exponential(MS(9000), 2.0, MS(5000), Jitter::None),
        BackoffStrategy::decorrelated(Duration::ZERO, MS(10)),
        BackoffStrategy::decorrelated(Duration::MAX, Duration::MAX),
        // Written as the variants, not made valid by a builder.
        BackoffStrategy::Fixed {
            min: MS(900),
            max: MS(500),
        },
        BackoffStrategy::Exponential {
            base: MS(9000),
            factor: f64::NAN,
            cap: MS(5000),
            jitter: Jitter::Full,
        },
        BackoffStrategy::Decorrelated {
            base: Duration::ZERO,
            cap: Duration::ZERO,
        },
    ];
    let mut rng = fastrand::Rng::with_seed(3);
    for b in weird {
        for retry in [0, 1, 2, 64, u32::MAX] {
            let _ = b.wait(retry, Duration::MAX, &mut rng);
            let _ = b.wait(retry, Duration::ZERO, &mut rng);
        }
    }
    // Reversed range: still inside the two bounds.
    let w = BackoffStrategy::fixed_range(MS(900), MS(500)).wait(1, Duration::ZERO, &mut rng);
    assert!(w >= MS(500) && w <= MS(900));
    // Base above cap: the cap wins.
    let w = BackoffStrategy::exponential(MS(9000), 2.0, MS(5000), Jitter::None).wait(
        1,
        Duration::ZERO,
        &mut rng,
    );
    assert_eq!(w, MS(5000));
}

#[test]
fn a_closure_is_a_backoff() {
    let linear = |retry: u32, _: Duration, _: &mut fastrand::Rng| MS(100) * retry;
    let mut rng = fastrand::Rng::with_seed(0);
    assert_eq!(linear.wait(3, Duration::ZERO, &mut rng), MS(300));
}

/// What a configuration file is refused for, a builder makes valid: a built strategy
/// always passes the config's own check.
#[test]
fn built_strategies_always_pass_the_config_check() {
    use toolshield_contract::config::Problems;
    let ms = Duration::from_millis;
    let built = [
        BackoffStrategy::fixed_range(ms(500), ms(200)),
        BackoffStrategy::exponential(ms(900), 0.5, ms(100), Jitter::Full),
        BackoffStrategy::exponential(ms(1), f64::NAN, ms(1), Jitter::None),
        BackoffStrategy::exponential(ms(1), f64::INFINITY, Duration::MAX, Jitter::None),
        BackoffStrategy::decorrelated(Duration::ZERO, Duration::ZERO),
        BackoffStrategy::decorrelated(ms(900), ms(100)),
    ];
    for s in built {
        let mut p = Problems::new();
        s.check("backoff", &mut p);
        assert!(p.into_result().is_ok(), "{s:?} fails the config check");
    }
    assert_eq!(
        BackoffStrategy::fixed_range(ms(500), ms(200)),
        BackoffStrategy::fixed_range(ms(200), ms(500))
    );
}
