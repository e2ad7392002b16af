//! An invalid configuration lists every problem in one answer: a section with a field that
//! does not parse (an unknown field, a value of the wrong type) still has the ranges of
//! its other fields checked, so fixing a configuration never takes two rounds.

use toolshield::config::ShieldConfig;
use toolshield_test::problem_fields;

fn problems(toml: &str) -> Vec<String> {
    let err = ShieldConfig::from_toml_str(toml).expect_err("invalid");
    let mut fields: Vec<String> = problem_fields(&err)
        .into_iter()
        .map(str::to_owned)
        .collect();
    fields.sort();
    fields
}

#[test]
fn an_unknown_field_does_not_hide_an_out_of_range_one_in_the_same_section() {
    let fields = problems(
        r#"
        [defaults.breaker]
        bogus = 1
        failure_rate = 200.0
        "#,
    );
    assert_eq!(
        fields,
        ["defaults.breaker.bogus", "defaults.breaker.failure_rate"],
        "both problems in one answer"
    );
}

#[test]
fn a_value_of_the_wrong_type_does_not_hide_an_out_of_range_one_in_a_tool_section() {
    let fields = problems(
        r#"
        [tools.weather]
        kind = "read_only"
        retry = { max_attempts = 0, jitter = "lots" }
        "#,
    );
    assert!(
        fields.contains(&"tools.weather.retry.max_attempts".to_owned()),
        "{fields:?}"
    );
    assert!(
        fields
            .iter()
            .any(|f| f.starts_with("tools.weather.retry.jitter")),
        "{fields:?}"
    );
}

#[test]
fn the_runs_table_lists_a_range_problem_beside_an_unknown_field() {
    let fields = problems(
        r#"
        [runs]
        typo = true
        max_runs = 0
        "#,
    );
    assert_eq!(fields, ["runs.max_runs", "runs.typo"]);
}
