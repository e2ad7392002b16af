//! `nan`, `inf` and `-inf` are valid TOML floats but no valid setting: each is a problem
//! at its own path, listed with the others, and never read as an absent (off) setting.
//! Before, JSON's lack of them turned each into `null`, which switched an optional
//! setting off (`timeout.soft`, `breaker.slow_call_rate`) without a word.

use toolshield::ShieldConfig;

#[test]
fn a_non_finite_float_is_a_problem_at_its_path_never_an_absent_setting() {
    for (section, key) in [
        ("defaults.timeout", "soft"),
        ("defaults.timeout", "total"),
        ("defaults.timeout", "idle"),
        ("defaults.breaker", "slow_call_rate"),
        ("defaults.breaker", "failure_rate"),
        ("tools.weather.breaker", "slow_call_rate"),
        ("defaults.retry", "max_attempts"),
    ] {
        for v in ["nan", "+nan", "-nan", "inf", "+inf", "-inf"] {
            let doc = format!("[{section}]\n{key} = {v}\n");
            let err = ShieldConfig::from_toml_str(&doc)
                .expect_err(&format!("{section}.{key} = {v} accepted"));
            let field = format!("{section}.{key}");
            let at: Vec<_> = err.problems().iter().filter(|p| p.field == field).collect();
            assert_eq!(at.len(), 1, "{doc}: {err}");
            assert!(at[0].message.contains("finite"), "{doc}: {err}");
            assert!(!err.to_string().contains("null"), "{doc}: {err}");
        }
    }
}

#[test]
fn every_non_finite_float_is_listed_with_the_other_problems() {
    let doc = "[defaults.timeout]\nsoft = nan\n\
               [defaults.breaker]\nslow_call_rate = inf\nfailure_rate = 700.0\n\
               [defaults.retry]\nbogus = 1\n";
    let err = ShieldConfig::from_toml_str(doc).unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    for f in [
        "defaults.timeout.soft",
        "defaults.breaker.slow_call_rate",
        "defaults.breaker.failure_rate",
        "defaults.retry.bogus",
    ] {
        assert!(fields.contains(&f), "{f} missing from {err}");
    }
}

#[test]
fn finite_floats_still_load() {
    let cfg = ShieldConfig::from_toml_str("[defaults.breaker]\nslow_call_rate = 0.5\n")
        .expect("a finite rate loads");
    let again = ShieldConfig::from_toml_str("[defaults.breaker]\nslow_call_rate = 5e-1\n")
        .expect("an exponent loads");
    assert_eq!(
        format!("{:?}", cfg.defaults.breaker),
        format!("{:?}", again.defaults.breaker)
    );
}
