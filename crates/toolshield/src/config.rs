//! One configuration for the whole stack, [`ShieldConfig`]: from TOML or JSON plus
//! `TOOLSHIELD_*` environment overrides, with defaults and per-tool sections.
//!
//! ```toml
//! enabled = true
//!
//! [defaults.timeout]
//! attempt = "10s"
//! soft = "2s"
//!
//! [tools.weather]
//! kind = "read_only"
//! cache = { ttl = "5m", stale_if_error = "1h" }
//! retry = { max_attempts = 4 }
//!
//! [tools.pay]
//! kind = "mutating"
//! idempotency = { on_pending = "fail_fast" }
//! schema = { type = "object", required = ["amount"] }
//! ```
//!
//! A tool section is merged field by field over `defaults`: `retry = { max_attempts = 4 }`
//! changes only the number of attempts. Loading reports every problem at once, each with
//! its path (`tools.weather.retry.backoff.min: min 900ms > max 500ms`), whether the problem
//! is a wrong type, an unknown field, a failed check of one layer, or a rule across
//! layers.
//!
//! # Environment overrides
//!
//! `TOOLSHIELD_ENABLED=false` turns the whole stack into a pass-through. Any other
//! setting is reached by its path in upper case with `__` between the parts:
//! `TOOLSHIELD_DEFAULTS__RETRY__MAX_ATTEMPTS=5`, `TOOLSHIELD_TOOLS__WEATHER__CACHE__TTL=10m`.
//! A value that parses as JSON (`5`, `false`, `{"ttl":"1m"}`) is used as such, anything
//! else as a string. Parts match without regard to case; a tool part names a tool the
//! document lists (an override cannot add one), and nothing is set by path inside
//! `schema` (give the whole schema as JSON). An override that cannot be applied (a
//! misspelt first part such as `TOOLSHIELD_DEFAULT__…`, an empty part, an unknown tool)
//! is a problem at the variable's name. Other variables (such as
//! `TOOLSHIELD_REDIS_URL`) are left to their readers.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use serde_path_to_error::Segment;
use toolshield_breaker::{BreakerConfig, WindowConfig};
use toolshield_budget::{BudgetConfig, LedgerConfig};
use toolshield_bulkhead::BulkheadConfig;
use toolshield_cache::ToolCacheConfig;
use toolshield_chaos::ChaosConfig;
use toolshield_core::config::Problems;
use toolshield_core::{CallKind, ConfigError};
use toolshield_hedge::HedgeConfig;
use toolshield_idempotency::IdempotencyConfig;
use toolshield_ratelimit::RateLimitConfig;
use toolshield_retry::RetryConfig;
use toolshield_timeout::TimeoutConfig;

/// The largest `max_keys` a `rate_limit`, `bulkhead` or `breaker` section accepts (10
/// million keys); each layer's own `validate` checks it.
pub use toolshield_core::config::MAX_KEYS;

/// The settings of one tool (or the defaults every tool starts from).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolConfig {
    /// The side-effect class of the tool: `read_only`, `idempotent` or `mutating`. When set,
    /// [`Shield::wrap`](crate::Shield::wrap) applies it to every call: a request that
    /// declares no kind takes it, one that declares another keeps the stricter of the two
    /// ([`CallKind::stricter`]). Unset (the default), each request's own kind decides, and a
    /// request without one is `mutating`.
    pub kind: Option<CallKind>,
    /// Attempt timeout, soft threshold, whole-call deadline.
    pub timeout: TimeoutConfig,
    /// Attempts, backoff, rate-limit wait, retry budget.
    pub retry: RetryConfig,
    /// Circuit breaker thresholds and waits.
    pub breaker: BreakerConfig,
    /// Result cache (read-only tools only); a TTL of 0 turns it off, the default.
    pub cache: ToolCacheConfig,
    /// Deduplication of mutating and idempotent calls.
    pub idempotency: IdempotencyConfig,
    /// JSON Schema of the tool's arguments.
    pub schema: Option<Value>,
    /// Hedged requests: after a delay, more attempts of a read-only call (or an idempotent
    /// one with a key), the first success wins. Off by default; refused on a mutating tool.
    pub hedge: HedgeConfig,
    /// Fault injection for testing agents: latency, errors, hangs, in-band failures at
    /// chosen rates, seeded. Off by default; logged and exported when on.
    pub faults: ChaosConfig,
    /// At most N calls of the tool in flight, then a bounded queue or `OVERLOADED`.
    /// Off (`None`) by default.
    pub bulkhead: Option<BulkheadConfig>,
    /// A GCRA rate limit per key (the tool, the caller, the run): wait or `RATE_LIMITED`
    /// with the exact `retry_after`. Off (`None`) by default.
    pub rate_limit: Option<RateLimitConfig>,
    /// This tool's share of an agent run's budget: `max_calls` per run, and `cost` units
    /// charged against the run's `runs.run_max_cost`. No limit by default.
    pub budget: BudgetConfig,
}

/// The configuration of a whole shield: a switch, defaults, and per-tool settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShieldConfig {
    /// `false` turns the stack into a pass-through (the rollout switch). Default `true`.
    pub enabled: bool,
    /// What every tool starts from.
    pub defaults: ToolConfig,
    /// Per-tool settings, already merged over the defaults. The tool names listed here
    /// are the registered names metrics label with; others are reported as `other`.
    pub tools: BTreeMap<String, ToolConfig>,
    /// The budgets of agent runs, shared by every tool: calls and cost per run, how a
    /// run is identified, how long its counts live (`[runs]`).
    pub runs: LedgerConfig,
}

impl Default for ShieldConfig {
    fn default() -> Self {
        ShieldConfig {
            enabled: true,
            defaults: ToolConfig::default(),
            tools: BTreeMap::new(),
            runs: LedgerConfig::default(),
        }
    }
}

const SECTIONS: [&str; 12] = [
    "kind",
    "timeout",
    "retry",
    "breaker",
    "cache",
    "idempotency",
    "schema",
    "hedge",
    "faults",
    "bulkhead",
    "rate_limit",
    "budget",
];

impl ShieldConfig {
    /// Parses TOML, applies no environment overrides, and checks everything.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let mut p = Problems::new();
        let value = parse_toml(text, "", &mut p)?;
        Self::build(value, p)
    }

    /// Parses JSON, applies no environment overrides, and checks everything.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| single("", format!("invalid JSON: {e}")))?;
        let mut p = Problems::new();
        json_duplicates(text, &mut p);
        Self::build(value, p)
    }

    /// Reads a `.toml` or `.json` file, applies the `TOOLSHIELD_*` environment overrides,
    /// and checks everything.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| single("", format!("cannot read {}: {e}", path.display())))?;
        let mut p = Problems::new();
        let mut value: Value = if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        {
            let value = serde_json::from_str(&text)
                .map_err(|e| single("", format!("invalid JSON in {}: {e}", path.display())))?;
            json_duplicates(&text, &mut p);
            value
        } else {
            parse_toml(&text, &format!(" in {}", path.display()), &mut p)?
        };
        apply_env(&mut value, std::env::vars_os().map(lossy), &mut p);
        Self::build(value, p)
    }

    /// The defaults with the `TOOLSHIELD_*` environment overrides of this process.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_value_with_env(Value::Object(Map::new()), std::env::vars_os().map(lossy))
    }

    /// Applies overrides given as `(name, value)` pairs (the environment, in tests) to a
    /// parsed document, then checks everything. An override that cannot be applied (a
    /// misspelt first part, an empty part, a tool the document does not list, a path
    /// below `schema` or through a value that is not a table) is a problem at the
    /// variable's name, listed with the others.
    pub fn from_value_with_env<I, K, V>(mut value: Value, vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut p = Problems::new();
        apply_env(&mut value, vars, &mut p);
        Self::build(value, p)
    }

    /// Builds and checks a configuration from a parsed document.
    pub fn from_value(value: Value) -> Result<Self, ConfigError> {
        Self::build(value, Problems::new())
    }

    /// [`from_value`](Self::from_value), listing `p` (problems found while reading) first.
    fn build(value: Value, mut p: Problems) -> Result<Self, ConfigError> {
        let Value::Object(mut root) = value else {
            let why = "the configuration must be a table";
            p.push("", why);
            return Err(p.into_result().err().unwrap_or_else(|| single("", why)));
        };
        let mut cfg = ShieldConfig::default();

        match root.remove("enabled") {
            None => {}
            Some(Value::Bool(b)) => cfg.enabled = b,
            Some(Value::String(s)) if matches!(s.as_str(), "true" | "false") => {
                cfg.enabled = s == "true"
            }
            Some(other) => p.push(
                "enabled",
                format_args!("expected true or false, got {other}"),
            ),
        }
        let defaults_value = root
            .remove("defaults")
            .unwrap_or_else(|| Value::Object(Map::new()));
        let tools_value = root
            .remove("tools")
            .unwrap_or_else(|| Value::Object(Map::new()));
        if let Some(runs) = root.remove("runs") {
            if let Some(runs) = deserialize_all::<LedgerConfig>(runs, "runs", &mut p) {
                cfg.runs = runs;
            }
        }
        for unknown in root.keys() {
            p.push(
                unknown.clone(),
                "unknown field (expected `enabled`, `defaults`, `tools` or `runs`)",
            );
        }

        let defaults_map = section_map(defaults_value, "defaults", &mut p);
        cfg.defaults = parse_tool(&defaults_map, None, "defaults", &mut p);

        match tools_value {
            Value::Object(tools) => {
                for (name, tool_value) in tools {
                    let path = format!("tools.{name}");
                    if let Some((field, why)) = tool_name_problem(&name) {
                        p.push(field, why);
                        continue;
                    }
                    let own = section_map(tool_value, &path, &mut p);
                    let tool =
                        parse_tool(&own, Some((&defaults_map, &cfg.defaults)), &path, &mut p);
                    cfg.tools.insert(name, tool);
                }
            }
            other => p.push(
                "tools",
                format_args!("expected a table of tools, got {other}"),
            ),
        }

        // Checks of the typed values (ranges, rules across fields and layers).
        p.extend("", cfg.validate_inner());
        p.into_result()?;
        Ok(cfg)
    }

    /// Every problem of an already-built configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_inner()
    }

    fn validate_inner(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        p.extend("runs", self.runs.validate());
        check_tool(&self.defaults, None, "defaults", &mut p);
        for (name, tool) in &self.tools {
            if let Some((field, why)) = tool_name_problem(name) {
                p.push(field, why);
                continue;
            }
            check_tool(tool, Some(&self.defaults), &format!("tools.{name}"), &mut p);
        }
        p.into_result()
    }

    /// The settings of `tool`: its own section, or the defaults.
    pub fn tool(&self, tool: &str) -> &ToolConfig {
        self.tools.get(tool).unwrap_or(&self.defaults)
    }
}

/// Why `name` cannot be a tool section's name, if it cannot: the field to report it at
/// (`tools` for a name that cannot be written in a path) and the message.
fn tool_name_problem(name: &str) -> Option<(String, String)> {
    if name.trim().is_empty() {
        let why = "a tool name must not be empty or blank";
        return Some(("tools".to_owned(), why.to_owned()));
    }
    if let Some(why) = toolshield_core::keys::check_tool_name(name) {
        return Some(("tools".to_owned(), format!("{}: {why}", quoted_name(name))));
    }
    let why = reserved_name(name)?;
    Some((format!("tools.{name}"), why.to_owned()))
}

/// Parses a TOML document into the JSON value the sections are read from. A float that
/// is not finite (`nan`, `inf`, `-inf`), which JSON cannot hold and the conversion would
/// turn into `null` (read as "off" by an optional setting), is a problem at its path and
/// taken out, as a field that does not parse is.
fn parse_toml(text: &str, file: &str, p: &mut Problems) -> Result<Value, ConfigError> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| single("", toml_problem(text, &e, file)))?;
    let mut value: Value =
        toml::from_str(text).map_err(|e| single("", toml_problem(text, &e, file)))?;
    non_finite_floats(&toml::Value::Table(table), &mut value, "", p);
    Ok(value)
}

fn non_finite_floats(toml: &toml::Value, json: &mut Value, path: &str, p: &mut Problems) {
    let at = |key: &dyn std::fmt::Display| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    let refused = |v: &toml::Value, here: &str, p: &mut Problems| match v {
        toml::Value::Float(f) if !f.is_finite() => {
            p.push(here, format_args!("must be a finite number, got {f}"));
            true
        }
        _ => false,
    };
    match (toml, json) {
        (toml::Value::Table(t), Value::Object(m)) => {
            for (k, v) in t {
                let here = at(k);
                if refused(v, &here, p) {
                    m.remove(k);
                } else if let Some(j) = m.get_mut(k) {
                    non_finite_floats(v, j, &here, p);
                }
            }
        }
        (toml::Value::Array(a), Value::Array(js)) => {
            for (i, (v, j)) in a.iter().zip(js.iter_mut()).enumerate() {
                let here = format!("{path}[{i}]");
                if !refused(v, &here, p) {
                    non_finite_floats(v, j, &here, p);
                }
            }
        }
        _ => {}
    }
}

/// The most bytes of a parser's message shown in a problem.
const MAX_PARSER_MESSAGE: usize = 256;

/// A TOML parse error as a bounded problem: where it is (line and column, counted in
/// characters from 1) and the parser's message cut to [`MAX_PARSER_MESSAGE`] bytes. The
/// parser's own rendering repeats the offending line whole, and a line may be as long
/// as the document (a reload's body included).
fn toml_problem(text: &str, e: &toml::de::Error, file: &str) -> String {
    let at = e
        .span()
        .map(|span| {
            let before = &text.as_bytes()[..span.start.min(text.len())];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let line_start = before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
            let column = String::from_utf8_lossy(&before[line_start..])
                .chars()
                .count()
                + 1;
            format!(" at line {line}, column {column}")
        })
        .unwrap_or_default();
    let message = toolshield_core::printable(e.message().trim(), MAX_PARSER_MESSAGE);
    format!("invalid TOML{file}{at}: {message}")
}

/// `name` quoted for a problem's message, escapes shown, cut to
/// [`MAX_TOOL_NAME_SHOWN`](toolshield_core::MAX_TOOL_NAME_SHOWN) bytes: a name sent in a
/// reload's body may be as long as the body, and the answer must not repeat it whole.
pub(crate) fn quoted_name(name: &str) -> String {
    let max = toolshield_core::MAX_TOOL_NAME_SHOWN;
    if name.len() <= max {
        return format!("{name:?}");
    }
    let mut end = max;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &name[..end], name.len())
}

/// Why `name` is reserved, if it is: it cannot name a tool section, nor a router's tool
/// or server route.
pub(crate) fn reserved_name(name: &str) -> Option<&'static str> {
    match name {
        "other" => Some("`other` is reserved: the metrics label of unregistered tools"),
        // The admin API's `/admin/breakers/all/{action}` acts on every breaker: a tool of
        // that name could not be acted on alone.
        "all" => Some("`all` is reserved: the admin API's key for every breaker"),
        // `ReloadSummary` (`changed`, `breaker_settings_kept`) names the defaults section
        // `defaults` among tool names: a tool of that name would make an entry mean either.
        "defaults" => Some(
            "`defaults` is reserved: the name of the defaults section (in reload summaries too)",
        ),
        _ => None,
    }
}

fn single(field: &str, message: impl std::fmt::Display) -> ConfigError {
    ConfigError::single(field, message)
}

fn section_map(value: Value, path: &str, p: &mut Problems) -> Map<String, Value> {
    match value {
        Value::Object(map) => {
            for key in map.keys() {
                if !SECTIONS.contains(&key.as_str()) {
                    p.push(
                        format!("{path}.{key}"),
                        format_args!("unknown field (expected one of {})", SECTIONS.join(", ")),
                    );
                }
            }
            map
        }
        other => {
            p.push(path, format_args!("expected a table, got {other}"));
            Map::new()
        }
    }
}

/// Parses one tool's sections. With `base` (the defaults' raw and parsed sections), a
/// section the tool does not mention is the parsed default, and one it mentions is
/// merged field by field over the default's raw section.
fn parse_tool(
    own: &Map<String, Value>,
    base: Option<(&Map<String, Value>, &ToolConfig)>,
    path: &str,
    p: &mut Problems,
) -> ToolConfig {
    fn section<T: DeserializeOwned + Clone + Default>(
        key: &str,
        own: &Map<String, Value>,
        base: Option<(&Map<String, Value>, &T)>,
        path: &str,
        p: &mut Problems,
    ) -> T {
        let value = match (own.get(key), base) {
            (None, Some((_, parsed))) => return parsed.clone(),
            (None, None) => return T::default(),
            (Some(v), Some((raw, _))) => match raw.get(key) {
                Some(default_raw) => merged(default_raw, v),
                None => v.clone(),
            },
            (Some(v), None) => v.clone(),
        };
        deserialize_all(value, &format!("{path}.{key}"), p).unwrap_or_default()
    }
    let b = base;
    let mut tool = ToolConfig {
        kind: section("kind", own, b.map(|(r, t)| (r, &t.kind)), path, p),
        timeout: section("timeout", own, b.map(|(r, t)| (r, &t.timeout)), path, p),
        retry: section("retry", own, b.map(|(r, t)| (r, &t.retry)), path, p),
        breaker: section("breaker", own, b.map(|(r, t)| (r, &t.breaker)), path, p),
        cache: section("cache", own, b.map(|(r, t)| (r, &t.cache)), path, p),
        idempotency: section(
            "idempotency",
            own,
            b.map(|(r, t)| (r, &t.idempotency)),
            path,
            p,
        ),
        schema: section("schema", own, b.map(|(r, t)| (r, &t.schema)), path, p),
        hedge: section("hedge", own, b.map(|(r, t)| (r, &t.hedge)), path, p),
        faults: section("faults", own, b.map(|(r, t)| (r, &t.faults)), path, p),
        bulkhead: section("bulkhead", own, b.map(|(r, t)| (r, &t.bulkhead)), path, p),
        rate_limit: section(
            "rate_limit",
            own,
            b.map(|(r, t)| (r, &t.rate_limit)),
            path,
            p,
        ),
        budget: section("budget", own, b.map(|(r, t)| (r, &t.budget)), path, p),
    };
    // The built-in slow-call threshold (2 s) is a default nobody wrote: with a short
    // attempt timeout (`timeout = { attempt = "1s" }`) it would be refused as "not below
    // the attempt timeout". A threshold no document wrote that does not fit is off.
    let writes_soft = |m: &Map<String, Value>| {
        m.get("timeout")
            .and_then(Value::as_object)
            .is_some_and(|t| t.contains_key("soft"))
    };
    let soft_written = writes_soft(own) || b.is_some_and(|(raw, _)| writes_soft(raw));
    if let (false, Some(soft)) = (soft_written, tool.timeout.soft) {
        if soft >= tool.timeout.attempt {
            tool.timeout.soft = None;
        }
    }
    tool
}

/// At most this many problems are listed for one section.
const MAX_SECTION_PROBLEMS: usize = 64;

/// Deserializes one section, listing every problem in it under `prefix`, not only the
/// first one serde meets: after each problem the offending field is taken out and the
/// section read again. An unknown field is reported at its own path
/// (`defaults.retry.backoff.bsae`).
///
/// The section read without its offending fields (their defaults in their place), so the
/// ranges and rules of the others are still checked and reported in the same answer; a
/// configuration with any problem is refused all the same. `None` when no such reading
/// was found.
fn deserialize_all<T: DeserializeOwned>(
    mut value: Value,
    prefix: &str,
    p: &mut Problems,
) -> Option<T> {
    let mut reported: Vec<String> = Vec::new();
    while reported.len() < MAX_SECTION_PROBLEMS {
        let e = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(t) => return Some(t),
            Err(e) => e,
        };
        let mut segments: Vec<Segment> = e.path().iter().cloned().collect();
        let inner = e.path().to_string();
        let message = e.into_inner().to_string();
        let mut field = if inner == "." || inner.is_empty() {
            prefix.to_owned()
        } else {
            format!("{prefix}.{inner}")
        };
        // The path of an unknown field ends at its table or at the field, depending on
        // how the section is deserialized: make it end at the field.
        let at_field = |u: &str| matches!(segments.last(), Some(Segment::Map { key }) if key == u);
        let named = unknown_field(&message)
            .filter(|u| !at_field(u))
            .map(str::to_owned)
            .or_else(|| value_named_in(table_at(&value, &segments)?, &message));
        if let Some(name) = named {
            field = format!("{field}.{name}");
            segments.push(Segment::Map { key: name });
        }
        // A problem at a field already reported, or at a table holding one (a tag taken
        // out, now missing), follows from the earlier one: stop there.
        let follows = reported.iter().any(|r| {
            r == &field
                || r.strip_prefix(field.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
        });
        if follows {
            break;
        }
        p.push(field.as_str(), message);
        reported.push(field);
        if !remove_at(&mut value, &segments) {
            break;
        }
    }
    None
}

/// The table at `path` in `value`, if there is one there.
fn table_at<'a>(value: &'a Value, path: &[Segment]) -> Option<&'a Map<String, Value>> {
    let mut at = value;
    for segment in path {
        match (segment, at) {
            (Segment::Map { key }, Value::Object(map)) => at = map.get(key)?,
            _ => return None,
        }
    }
    at.as_object()
}

/// The one field of `table` whose value serde's message quotes (`invalid value: string
/// "x", expected a duration`): a problem inside a tagged section (a backoff, a window) is
/// reported at its table, and this finds the field it is about. `None` unless exactly
/// one field matches.
fn value_named_in(table: &Map<String, Value>, message: &str) -> Option<String> {
    let quoted = |v: &Value| match v {
        Value::String(s) => Some(format!("string {s:?}")),
        Value::Number(n) => Some(format!("`{n}`")),
        Value::Bool(b) => Some(format!("`{b}`")),
        _ => None,
    };
    let mut found = table
        .iter()
        .filter(|(_, v)| quoted(v).is_some_and(|q| message.contains(&q)))
        .map(|(k, _)| k);
    match (found.next(), found.next()) {
        (Some(k), None) => Some(k.clone()),
        _ => None,
    }
}

/// The field named by serde's "unknown field `name`, expected ..." message.
fn unknown_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.split_once('`').map(|(name, _)| name)
}

/// Takes the value at `path` out of `value` (tables only); whether it was there.
fn remove_at(value: &mut Value, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = value;
    for segment in parents {
        match (segment, at) {
            (Segment::Map { key }, Value::Object(map)) => match map.get_mut(key) {
                Some(next) => at = next,
                None => return false,
            },
            _ => return false,
        }
    }
    match (last, at) {
        (Segment::Map { key }, Value::Object(map)) => map.remove(key).is_some(),
        _ => false,
    }
}

/// `over` merged field by field onto `base` (tables merge, anything else replaces).
fn merged(base: &Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            let mut out = b.clone();
            for (k, v) in o {
                let m = match out.get(k) {
                    Some(existing) => merged(existing, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), m);
            }
            Value::Object(out)
        }
        (_, o) => o.clone(),
    }
}

/// Checks one tool. A section a tool inherits unchanged from `defaults` was checked
/// there, so its problems are reported once, under `defaults`.
fn check_tool(tool: &ToolConfig, defaults: Option<&ToolConfig>, path: &str, p: &mut Problems) {
    let own = |same: fn(&ToolConfig, &ToolConfig) -> bool| defaults.is_none_or(|d| !same(tool, d));
    if own(|a, b| a.timeout == b.timeout) {
        p.extend(&format!("{path}.timeout"), tool.timeout.validate());
    }
    if own(|a, b| a.retry == b.retry) {
        p.extend(&format!("{path}.retry"), tool.retry.validate());
    }
    if own(|a, b| a.breaker == b.breaker) {
        p.extend(&format!("{path}.breaker"), tool.breaker.validate());
    }
    if own(|a, b| a.idempotency == b.idempotency) {
        p.extend(&format!("{path}.idempotency"), tool.idempotency.validate());
    }
    if own(|a, b| a.cache == b.cache) {
        // Its own check bounds `ttl` and `stale_if_error` by `MAX_DURATION`: checked once.
        p.extend(&format!("{path}.cache"), tool.cache.validate());
    }
    let window_rule_is_own = own(|a, b| a.timeout == b.timeout && a.breaker == b.breaker);
    if let (true, WindowConfig::Time { duration, .. }) = (window_rule_is_own, tool.breaker.window) {
        let min = tool.timeout.attempt.saturating_mul(2);
        p.check(
            duration >= min,
            format!("{path}.breaker.window.duration"),
            format_args!(
                "{duration:?} is shorter than 2 x the attempt timeout ({min:?}): a slow failure would leave the window before it counts"
            ),
        );
    }
    if !tool.cache.ttl.is_zero() && tool.kind != Some(CallKind::ReadOnly) {
        let kind = tool
            .kind
            .map_or("not declared (mutating)", CallKind::as_str);
        p.push(
            format!("{path}.cache.ttl"),
            format_args!("only read_only tools are cached, this one is {kind}"),
        );
    }
    if own(|a, b| a.hedge == b.hedge) {
        p.extend(&format!("{path}.hedge"), tool.hedge.validate());
    }
    // A mutating tool is never hedged, whatever the defaults say: checked for every tool.
    if tool.hedge.enabled && tool.kind == Some(CallKind::Mutating) {
        p.push(
            format!("{path}.hedge.enabled"),
            "hedging sends a call more than once: a mutating tool must not be hedged",
        );
    }
    if own(|a, b| a.faults == b.faults) {
        p.extend(&format!("{path}.faults"), tool.faults.validate());
    }
    if let (true, Some(bulkhead)) = (own(|a, b| a.bulkhead == b.bulkhead), &tool.bulkhead) {
        p.extend(&format!("{path}.bulkhead"), bulkhead.validate());
    }
    if let (true, Some(limit)) = (own(|a, b| a.rate_limit == b.rate_limit), &tool.rate_limit) {
        p.extend(&format!("{path}.rate_limit"), limit.validate());
    }
    if own(|a, b| a.budget == b.budget) {
        p.extend(&format!("{path}.budget"), tool.budget.validate());
    }
    if let (true, Some(schema)) = (own(|a, b| a.schema == b.schema), &tool.schema) {
        if let Err(e) = toolshield_validate::Schema::new(schema.clone()) {
            for problem in e.problems() {
                p.push(format!("{path}.schema"), &problem.message);
            }
        }
    }
}

/// An environment variable as text; a name or value that is not UTF-8 is converted
/// lossily rather than panicking like [`std::env::vars`].
fn lossy((k, v): (std::ffi::OsString, std::ffi::OsString)) -> (String, String) {
    (
        k.to_string_lossy().into_owned(),
        v.to_string_lossy().into_owned(),
    )
}

/// The first parts of an override.
const ROOTS: [&str; 3] = ["enabled", "defaults", "tools"];

/// One `TOOLSHIELD_*` override: the variable's name, its path (as written) and its value.
struct Override {
    var: String,
    parts: Vec<String>,
    value: Value,
}

/// Whether `first` (lower case) looks like a misspelt root: one or two edits away
/// (`default`, `enable`, `tool`) or a root glued to the rest by one underscore
/// (`defaults_retry`). Other `TOOLSHIELD_*` names (`REDIS_URL`, `ADMIN_TOKEN`) are
/// further away and left to their readers.
fn near_root(first: &str) -> bool {
    ROOTS
        .iter()
        .any(|r| edit_distance(first, r) <= 2 || first.starts_with(&format!("{r}_")))
}

/// Levenshtein distance of two short ASCII-ish strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != *cb));
            diag = above;
        }
    }
    row[b.len()]
}

/// Applies the `TOOLSHIELD_*` overrides among `vars` to `value`, recording at the
/// variable's name every one that cannot be applied.
///
/// Parts are matched without regard to case: the roots and section keys are lower case,
/// and a tool part names the tool of the document whose name is equal ignoring ASCII
/// case. Paths below `schema` are refused: JSON Schema keys are case-sensitive
/// (`additionalProperties`), and a variable name cannot keep their case.
fn apply_env<I, K, V>(value: &mut Value, vars: I, p: &mut Problems)
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut overrides: Vec<Override> = Vec::new();
    for (k, v) in vars {
        let var = k.as_ref();
        let Some(rest) = var.strip_prefix("TOOLSHIELD_") else {
            continue;
        };
        let parts: Vec<String> = rest.split("__").map(str::to_owned).collect();
        let first = parts[0].to_ascii_lowercase();
        if !ROOTS.contains(&first.as_str()) {
            // A path (`__`) or a name close to a root is a misspelt override; anything
            // else belongs to another reader (`TOOLSHIELD_REDIS_URL`).
            if parts.len() > 1 || near_root(&first) {
                p.push(
                    var,
                    format_args!(
                        "unknown setting `{}`: expected TOOLSHIELD_ENABLED, TOOLSHIELD_DEFAULTS__... or TOOLSHIELD_TOOLS__...",
                        parts[0]
                    ),
                );
            }
            continue;
        }
        if parts.iter().any(String::is_empty) {
            p.push(
                var,
                "a part of the path is empty: parts are separated by exactly `__`",
            );
            continue;
        }
        let raw = v.as_ref();
        let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()));
        overrides.push(Override {
            var: var.to_owned(),
            parts,
            value,
        });
    }
    // Deterministic order whatever the environment's order: a table before its keys.
    let folded =
        |o: &Override| -> Vec<String> { o.parts.iter().map(|s| s.to_ascii_lowercase()).collect() };
    overrides.sort_by_cached_key(folded);
    for pair in overrides.windows(2) {
        if folded(&pair[0]) == folded(&pair[1]) {
            p.push(
                &pair[1].var,
                format_args!(
                    "sets the same key as {}: which one wins would depend on the environment's order",
                    pair[0].var
                ),
            );
        }
    }
    let Value::Object(root) = value else {
        return;
    };
    for o in overrides {
        match resolve(root, &o) {
            Ok(path) => set(root, &path, o.value, &o.var, p),
            Err(why) => p.push(&o.var, why),
        }
    }
}

/// The path of an override in the document: parts in lower case, except the tool name,
/// which is that of the matching tool in the document.
fn resolve(root: &Map<String, Value>, o: &Override) -> Result<Vec<String>, String> {
    let mut path: Vec<String> = Vec::with_capacity(o.parts.len());
    let mut parts = o.parts.iter();
    let first = parts
        .next()
        .map(|s| s.to_ascii_lowercase())
        .unwrap_or_default();
    path.push(first.clone());
    let section_at = match first.as_str() {
        "enabled" => {
            if o.parts.len() > 1 {
                return Err("`enabled` is true or false, it has no keys below it".to_owned());
            }
            return Ok(path);
        }
        "defaults" => 1,
        _ => {
            let Some(tool) = parts.next() else {
                return Ok(path);
            };
            path.push(find_tool(root, tool)?);
            2
        }
    };
    for (i, part) in parts.enumerate() {
        let lower = part.to_ascii_lowercase();
        if i == 0 && !SECTIONS.contains(&lower.as_str()) {
            return Err(format!(
                "unknown section `{part}` (expected one of {})",
                SECTIONS.join(", ")
            ));
        }
        if i == 1 && path[section_at] == "schema" {
            let owner = path[..section_at].join("__").to_ascii_uppercase();
            return Err(format!(
                "cannot set a key inside `schema`: JSON Schema keys are case-sensitive and a variable name is not; give the whole schema as JSON in TOOLSHIELD_{owner}__SCHEMA"
            ));
        }
        path.push(lower);
    }
    Ok(path)
}

/// The name of the document's tool equal to `part` ignoring ASCII case.
fn find_tool(root: &Map<String, Value>, part: &str) -> Result<String, String> {
    let tools = match root.get("tools") {
        Some(Value::Object(tools)) => tools,
        _ => &Map::new(),
    };
    let mut found = tools.keys().filter(|k| k.eq_ignore_ascii_case(part));
    match (found.next(), found.next()) {
        (Some(name), None) => Ok(name.clone()),
        (Some(a), Some(b)) => Err(format!(
            "tool `{part}` matches both `{a}` and `{b}`, whose names differ only in case"
        )),
        (None, _) => {
            // `__` separates the parts of a variable's path: a tool whose name holds it
            // cannot be named by one.
            let prefix = format!("{part}__");
            if let Some(name) = tools.keys().find(|k| {
                k.get(..prefix.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(&prefix))
            }) {
                return Err(format!(
                    "no tool `{part}`: the tool `{name}` cannot be set from the environment, as `__` separates the parts of a variable's path; set it in the file"
                ));
            }
            Err(format!(
                "no tool `{part}` in the configuration (tool names match without regard to case); an override cannot add a tool: add its section to the file"
            ))
        }
    }
}

/// Writes `v` at `path`, creating the tables on the way.
fn set(root: &mut Map<String, Value>, path: &[String], v: Value, var: &str, p: &mut Problems) {
    let Some((last, inner)) = path.split_last() else {
        return;
    };
    let mut map = root;
    for (i, part) in inner.iter().enumerate() {
        let node = map
            .entry(part.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(next) = node else {
            p.push(
                var,
                format_args!(
                    "`{}` is not a table, so nothing can be set below it",
                    path[..=i].join(".")
                ),
            );
            return;
        };
        map = next;
    }
    map.insert(last.clone(), v);
}

/// Records every key given twice in one JSON object of `text` (already parsed as valid
/// JSON): `serde_json` keeps the last silently, where TOML rejects the file.
fn json_duplicates(text: &str, p: &mut Problems) {
    use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};

    /// Walks one JSON value, pushing the paths of duplicate keys below `path`.
    struct Walk<'a> {
        path: Vec<String>,
        dups: &'a mut Vec<Vec<String>>,
    }

    impl Walk<'_> {
        fn child(&mut self, part: &str) -> Walk<'_> {
            let mut path = self.path.clone();
            path.push(part.to_owned());
            Walk {
                path,
                dups: self.dups,
            }
        }
    }

    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            let mut i = 0usize;
            while seq.next_element_seed(self.child(&i.to_string()))?.is_some() {
                i += 1;
            }
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::BTreeSet::new();
            while let Some(key) = map.next_key::<String>()? {
                map.next_value_seed(self.child(&key))?;
                if !seen.insert(key.clone()) {
                    let path = self.child(&key).path;
                    self.dups.push(path);
                }
            }
            Ok(())
        }
    }

    let mut dups = Vec::new();
    let mut de = serde_json::Deserializer::from_str(text);
    let walk = Walk {
        path: Vec::new(),
        dups: &mut dups,
    };
    if walk.deserialize(&mut de).is_err() {
        return; // not reached: the text parsed as JSON already
    }
    for path in dups {
        let field = path.join(".");
        match path.as_slice() {
            [tools, tool] if tools == "tools" => p.push(
                field,
                format_args!("tool `{tool}` is listed twice (the last would silently win)"),
            ),
            _ => p.push(field, "key given twice (the last would silently win)"),
        }
    }
}
