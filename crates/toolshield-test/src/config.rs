//! Reading a configuration error.

use toolshield_core::ConfigError;

/// The field paths of every problem of `err`, in order: what a test of `validate()`
/// compares, since a config error lists every problem at once.
///
/// ```
/// use toolshield_core::config::Problems;
/// use toolshield_test::problem_fields;
///
/// let mut problems = Problems::new();
/// problems.push("max_attempts", "must be at least 1");
/// problems.push("attempt", "must not be zero");
/// let err = problems.into_result().unwrap_err();
/// assert_eq!(problem_fields(&err), ["max_attempts", "attempt"]);
/// ```
pub fn problem_fields(err: &ConfigError) -> Vec<&str> {
    err.problems().iter().map(|p| p.field.as_str()).collect()
}
