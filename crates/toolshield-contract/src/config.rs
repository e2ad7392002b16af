//! Configuration errors shared by every layer: a `validate()` returns every problem at
//! once, each with the path of the field it is about.

use std::fmt;

/// One problem in a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The dotted path of the field, e.g. `tools.weather.retry.jitter`.
    pub field: String,
    /// What is wrong, e.g. `min 900ms > max 500ms`.
    pub message: String,
}

/// The most bytes of a problem's field path, and of its message, that a [`ConfigError`]
/// keeps. Both may quote what a configuration's author wrote (an unknown key, a value, a
/// tool name), and a configuration may come from a reload's body: a problem is one line
/// of bounded length whatever the input. Control characters become spaces.
pub const MAX_PROBLEM_TEXT: usize = 1024;

impl ConfigProblem {
    /// A problem at `field`, each part made one printable line of at most
    /// [`MAX_PROBLEM_TEXT`] bytes.
    #[must_use]
    pub fn new(field: impl Into<String>, message: impl fmt::Display) -> Self {
        ConfigProblem {
            field: bounded(field.into()),
            message: bounded(message.to_string()),
        }
    }
}

/// `text` as one printable line of at most [`MAX_PROBLEM_TEXT`] bytes.
fn bounded(text: String) -> String {
    match crate::error::printable(&text, MAX_PROBLEM_TEXT) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(line) => line,
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found in a configuration. Never empty.
///
/// Its `Debug` output is the same readable list as its `Display`, so a `main` that
/// returns `Result<(), Box<dyn Error>>` and fails on `?` prints every problem, one per
/// line, not a struct dump.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    problems: Vec<ConfigProblem>,
    /// Problems found past [`MAX_PROBLEMS`], counted, not kept.
    unlisted: usize,
}

/// The most problems a [`ConfigError`] lists; it counts the rest. A configuration may
/// come from a reload's body, and one with a million unknown keys must not answer with a
/// million lines.
pub const MAX_PROBLEMS: usize = 1000;

impl ConfigError {
    /// An error with one problem.
    #[must_use]
    pub fn single(field: impl Into<String>, message: impl fmt::Display) -> Self {
        ConfigError {
            problems: vec![ConfigProblem::new(field, message)],
            unlisted: 0,
        }
    }

    /// The problems, in the order they were found: the first [`MAX_PROBLEMS`].
    pub fn problems(&self) -> &[ConfigProblem] {
        &self.problems
    }

    /// How many problems were found beyond the [`MAX_PROBLEMS`] listed.
    #[must_use]
    pub fn unlisted(&self) -> usize {
        self.unlisted
    }

    /// Prefixes every field path with `prefix.` (to nest a layer's config in a larger one).
    #[must_use]
    pub fn prefixed(mut self, prefix: &str) -> Self {
        if prefix.is_empty() {
            return self;
        }
        for p in &mut self.problems {
            p.field = bounded(if p.field.is_empty() {
                prefix.to_owned()
            } else {
                format!("{prefix}.{}", p.field)
            });
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len().saturating_add(self.unlisted);
        write!(
            f,
            "invalid configuration: {n} problem{}",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        if self.unlisted > 0 {
            write!(f, "\n  - and {} more, not listed", self.unlisted)?;
        }
        Ok(())
    }
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for ConfigError {}

/// Collects problems while validating.
///
/// ```
/// use toolshield_contract::config::Problems;
///
/// let (min, max) = (900, 500);
/// let mut problems = Problems::new();
/// problems.check(min <= max, "retry.jitter", format_args!("min {min}ms > max {max}ms"));
/// problems.check(3 > 0, "retry.max_attempts", "must be at least 1");
/// let err = problems.into_result().unwrap_err();
/// assert_eq!(err.problems().len(), 1);
/// assert_eq!(err.to_string(), "invalid configuration: 1 problem\n  - retry.jitter: min 900ms > max 500ms");
/// ```
#[derive(Debug, Default)]
pub struct Problems {
    problems: Vec<ConfigProblem>,
    /// Found past [`MAX_PROBLEMS`]: counted, not kept.
    unlisted: usize,
}

impl Problems {
    /// No problems yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a problem at `field` unless `ok` holds.
    pub fn check(&mut self, ok: bool, field: impl Into<String>, message: impl fmt::Display) {
        if !ok {
            self.push(field, message);
        }
    }

    /// Records a problem at `field`.
    pub fn push(&mut self, field: impl Into<String>, message: impl fmt::Display) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(ConfigProblem::new(field, message));
        } else {
            self.unlisted = self.unlisted.saturating_add(1);
        }
    }

    /// Records a problem at `field` when `d` is longer than [`MAX_DURATION`]: every
    /// duration of every configuration is bounded, so no deadline computed from it can
    /// overflow the clock.
    pub fn check_duration(&mut self, d: std::time::Duration, field: impl Into<String>) {
        self.check(
            d <= MAX_DURATION,
            field,
            format_args!(
                "{} is longer than the longest duration accepted ({})",
                HumanDuration(d),
                HumanDuration(MAX_DURATION)
            ),
        );
    }

    /// Records a problem at `field` unless `max_keys` is between 1 and [`MAX_KEYS`]: a
    /// map with one entry per distinct key (a caller, a run, a host) is bounded only if
    /// its bound is.
    pub fn check_max_keys(&mut self, max_keys: u64, field: impl Into<String>) {
        let field = field.into();
        if max_keys == 0 {
            self.push(field, "must be at least 1");
        } else if max_keys > MAX_KEYS as u64 {
            self.push(
                field,
                format_args!("must be at most {MAX_KEYS}, got {max_keys}"),
            );
        }
    }

    /// Adds the problems of a nested config under `prefix`.
    pub fn extend(&mut self, prefix: &str, nested: Result<(), ConfigError>) {
        if let Err(e) = nested {
            let e = e.prefixed(prefix);
            let room = MAX_PROBLEMS.saturating_sub(self.problems.len());
            let past = e.problems.len().saturating_sub(room);
            self.problems.extend(e.problems.into_iter().take(room));
            self.unlisted = self
                .unlisted
                .saturating_add(past)
                .saturating_add(e.unlisted);
        }
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.problems.is_empty()
    }

    /// `Ok` when nothing was found, else every problem.
    pub fn into_result(self) -> Result<(), ConfigError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                problems: self.problems,
                unlisted: self.unlisted,
            })
        }
    }
}

/// The longest duration any configuration or builder accepts: 366 days. Long enough for
/// any TTL, lease or timeout a tool call needs, short enough that `now + d` never
/// overflows a clock.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);

/// The largest `max_keys` of a keyed map a configuration accepts (a rate limiter's, a
/// bulkhead's, a breaker registry's): 10 million keys, a thousand times their default.
/// Each holds one entry per distinct key, so its bound is what keeps memory finite under
/// hostile callers; a larger figure is no bound at all.
pub const MAX_KEYS: usize = 10_000_000;

/// `now + d`, or `now + MAX_DURATION` when `d` is longer (or that overflows too, `now`
/// itself pushed as far as it goes): the request path never panics on a duration.
pub fn deadline_after(now: tokio::time::Instant, d: std::time::Duration) -> tokio::time::Instant {
    now.checked_add(d.min(MAX_DURATION))
        .or_else(|| now.checked_add(MAX_DURATION))
        .unwrap_or(now)
}

/// A duration as people write it in config files: `366d`, `1h 30m`, `250ms`.
struct HumanDuration(std::time::Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs();
        let millis = self.0.subsec_millis();
        let parts = [
            (secs / 86_400, "d"),
            (secs / 3600 % 24, "h"),
            (secs / 60 % 60, "m"),
            (secs % 60, "s"),
            (u64::from(millis), "ms"),
        ];
        let mut first = true;
        for (value, unit) in parts {
            if value > 0 {
                if !first {
                    f.write_str(" ")?;
                }
                write!(f, "{value}{unit}")?;
                first = false;
            }
        }
        if first {
            write!(f, "{:?}", self.0)?;
        }
        Ok(())
    }
}

/// Serde for `Duration` as human-readable text (`"30s"`, `"500ms"`, `"1h"`), for config
/// files: `#[serde(with = "toolshield_contract::config::duration")]` (feature `serde`).
#[cfg(feature = "serde")]
pub mod duration {
    pub use humantime_serde::{deserialize, serialize};

    /// The same for `Option<Duration>`.
    pub mod option {
        pub use humantime_serde::option::{deserialize, serialize};
    }
}
