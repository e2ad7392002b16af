//! Configuration: defaults, serde with unknown fields rejected, and a validation that
//! lists every problem.

use std::time::Duration;

use toolshield_retry::{BackoffStrategy, BudgetConfig, Jitter, RetryConfig, RetryLayer};

#[test]
fn defaults_follow_the_design() {
    let cfg = RetryConfig::default();
    assert_eq!(cfg.max_attempts, 3);
    assert_eq!(
        cfg.backoff,
        BackoffStrategy::exponential(
            Duration::from_millis(500),
            2.0,
            Duration::from_secs(5),
            Jitter::Full
        )
    );
    assert_eq!(cfg.rate_limit_backoff, Duration::from_secs(30));
    assert_eq!(
        cfg.budget,
        BudgetConfig {
            enabled: true,
            ratio: 0.2,
            min_per_sec: 10,
            burst: 100
        }
    );
    assert!(cfg.validate().is_ok());
    assert_eq!(RetryLayer::default().max_attempts(), 3);
}

#[test]
fn serde_reads_human_durations_and_fills_defaults() {
    let cfg: RetryConfig = serde_json::from_str(
        r#"{"backoff": {"strategy": "decorrelated", "base": "100ms", "cap": "2s"},
            "budget": {"ratio": 0.1}}"#,
    )
    .unwrap();
    assert_eq!(
        cfg.backoff,
        BackoffStrategy::decorrelated(Duration::from_millis(100), Duration::from_secs(2))
    );
    assert_eq!(cfg.max_attempts, 3);
    assert_eq!(cfg.budget.ratio, 0.1);
    assert_eq!(cfg.budget.min_per_sec, 10);

    let none: RetryConfig = serde_json::from_str(r#"{"backoff": {"strategy": "none"}}"#).unwrap();
    assert_eq!(none.backoff, BackoffStrategy::none());

    let back: RetryConfig = serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
    assert_eq!(back, cfg, "round trip");
}

#[test]
fn unknown_fields_are_rejected() {
    for bad in [
        r#"{"max_atempts": 3}"#,
        r#"{"budget": {"percent": 20}}"#,
        r#"{"backoff": {"strategy": "fixed", "min": "1s", "max": "2s", "jitter": "full"}}"#,
        r#"{"backoff": {"strategy": "linear"}}"#,
    ] {
        assert!(serde_json::from_str::<RetryConfig>(bad).is_err(), "{bad}");
    }
}

#[test]
fn validation_lists_every_problem_at_once() {
    let cfg = RetryConfig {
        max_attempts: 0,
        // Written as a file would (the builder would make it valid).
        backoff: BackoffStrategy::Exponential {
            base: Duration::from_secs(10),
            factor: 0.0,
            cap: Duration::from_secs(5),
            jitter: Jitter::Full,
        },
        budget: BudgetConfig {
            enabled: true,
            ratio: -0.5,
            min_per_sec: 0,
            burst: 0,
        },
        ..Default::default()
    };
    let err = cfg.validate().unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "max_attempts",
            "backoff.factor",
            "backoff.base",
            "budget.ratio",
            "budget.burst",
            "budget.min_per_sec"
        ]
    );
    let text = err.to_string();
    assert!(
        text.starts_with("invalid configuration: 6 problems"),
        "{text}"
    );
    assert!(text.contains("backoff.base: base 10s > cap 5s"), "{text}");

    let layer = RetryLayer::from_config(&cfg);
    assert_eq!(
        layer.unwrap_err().problems().len(),
        6,
        "from_config refuses it"
    );
}

#[test]
fn fixed_range_with_min_above_max_is_rejected() {
    let cfg = RetryConfig {
        backoff: BackoffStrategy::Fixed {
            min: Duration::from_millis(900),
            max: Duration::from_millis(500),
        },
        ..Default::default()
    };
    let err = cfg.validate().unwrap_err();
    assert_eq!(err.problems().len(), 1);
    assert_eq!(err.problems()[0].field, "backoff.min");
    assert_eq!(err.problems()[0].message, "min 900ms > max 500ms");
}

#[test]
fn decorrelated_needs_a_positive_base_and_a_disabled_budget_is_not_checked() {
    let cfg = RetryConfig {
        backoff: BackoffStrategy::Decorrelated {
            base: Duration::ZERO,
            cap: Duration::from_secs(1),
        },
        budget: BudgetConfig {
            enabled: false,
            ratio: f64::NAN,
            ..Default::default()
        },
        ..Default::default()
    };
    let err = cfg.validate().unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["backoff.base"]);
}
