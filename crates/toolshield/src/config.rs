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
//! else as a string. Variables whose first part is not `ENABLED`, `DEFAULTS` or `TOOLS`
//! (such as `TOOLSHIELD_REDIS_URL`) are left to other readers.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolshield_breaker::{BreakerConfig, WindowConfig};
use toolshield_cache::ToolCacheConfig;
use toolshield_core::config::Problems;
use toolshield_core::{CallKind, ConfigError};
use toolshield_idempotency::IdempotencyConfig;
use toolshield_retry::RetryConfig;
use toolshield_timeout::TimeoutConfig;

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
}

impl Default for ShieldConfig {
    fn default() -> Self {
        ShieldConfig {
            enabled: true,
            defaults: ToolConfig::default(),
            tools: BTreeMap::new(),
        }
    }
}

const SECTIONS: [&str; 7] = [
    "kind",
    "timeout",
    "retry",
    "breaker",
    "cache",
    "idempotency",
    "schema",
];

impl ShieldConfig {
    /// Parses TOML, applies no environment overrides, and checks everything.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let value: Value =
            toml::from_str(text).map_err(|e| single("", format!("invalid TOML: {e}")))?;
        Self::from_value(value)
    }

    /// Parses JSON, applies no environment overrides, and checks everything.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| single("", format!("invalid JSON: {e}")))?;
        Self::from_value(value)
    }

    /// Reads a `.toml` or `.json` file, applies the `TOOLSHIELD_*` environment overrides,
    /// and checks everything.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| single("", format!("cannot read {}: {e}", path.display())))?;
        let value: Value = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text)
                .map_err(|e| single("", format!("invalid JSON in {}: {e}", path.display())))?
        } else {
            toml::from_str(&text)
                .map_err(|e| single("", format!("invalid TOML in {}: {e}", path.display())))?
        };
        Self::from_value_with_env(value, std::env::vars())
    }

    /// The defaults with the `TOOLSHIELD_*` environment overrides of this process.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_value_with_env(Value::Object(Map::new()), std::env::vars())
    }

    /// Applies overrides given as `(name, value)` pairs (the environment, in tests) to a
    /// parsed document, then checks everything.
    pub fn from_value_with_env<I, K, V>(mut value: Value, vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        apply_env(&mut value, vars);
        Self::from_value(value)
    }

    /// Builds and checks a configuration from a parsed document.
    pub fn from_value(value: Value) -> Result<Self, ConfigError> {
        let mut p = Problems::new();
        let Value::Object(mut root) = value else {
            return Err(single("", "the configuration must be a table"));
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
        for unknown in root.keys() {
            p.push(
                unknown.clone(),
                "unknown field (expected `enabled`, `defaults` or `tools`)",
            );
        }

        let defaults_map = section_map(defaults_value, "defaults", &mut p);
        cfg.defaults = parse_tool(&defaults_map, None, "defaults", &mut p);

        match tools_value {
            Value::Object(tools) => {
                for (name, tool_value) in tools {
                    let path = format!("tools.{name}");
                    if name.trim().is_empty() {
                        p.push("tools", "a tool name must not be empty or blank");
                        continue;
                    }
                    if let Some(why) = toolshield_core::keys::check_tool_name(&name) {
                        p.push("tools", format_args!("{name:?}: {why}"));
                        continue;
                    }
                    if name == "other" {
                        p.push(
                            path,
                            "`other` is reserved: the metrics label of unregistered tools",
                        );
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
        check_tool(&self.defaults, None, "defaults", &mut p);
        for (name, tool) in &self.tools {
            check_tool(tool, Some(&self.defaults), &format!("tools.{name}"), &mut p);
        }
        p.into_result()
    }

    /// The settings of `tool`: its own section, or the defaults.
    pub fn tool(&self, tool: &str) -> &ToolConfig {
        self.tools.get(tool).unwrap_or(&self.defaults)
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
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(t) => t,
            Err(e) => {
                let inner = e.path().to_string();
                let field = if inner == "." || inner.is_empty() {
                    format!("{path}.{key}")
                } else {
                    format!("{path}.{key}.{inner}")
                };
                p.push(field, e.into_inner());
                T::default()
            }
        }
    }
    let b = base;
    ToolConfig {
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
    if own(|a, b| a.cache == b.cache) {
        p.check_duration(tool.cache.ttl, format!("{path}.cache.ttl"));
        if let Some(grace) = tool.cache.stale_if_error {
            p.check_duration(grace, format!("{path}.cache.stale_if_error"));
        }
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
    if let (true, Some(schema)) = (own(|a, b| a.schema == b.schema), &tool.schema) {
        if let Err(e) = toolshield_validate::Schemas::builder()
            .tool("t", schema.clone())
            .build()
        {
            for problem in e.problems() {
                p.push(format!("{path}.schema"), &problem.message);
            }
        }
    }
}

fn apply_env<I, K, V>(value: &mut Value, vars: I)
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut overrides: Vec<(Vec<String>, Value)> = Vec::new();
    for (k, v) in vars {
        let Some(rest) = k.as_ref().strip_prefix("TOOLSHIELD_") else {
            continue;
        };
        let parts: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        if !matches!(
            parts.first().map(String::as_str),
            Some("enabled" | "defaults" | "tools")
        ) {
            continue;
        }
        if parts.iter().any(String::is_empty) {
            continue;
        }
        let raw = v.as_ref();
        let parsed = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()));
        overrides.push((parts, parsed));
    }
    // Deterministic order whatever the environment's order.
    overrides.sort_by(|a, b| a.0.cmp(&b.0));
    if !value.is_object() {
        return;
    }
    for (parts, v) in overrides {
        let mut node = &mut *value;
        for (i, part) in parts.iter().enumerate() {
            let Value::Object(map) = node else { break };
            if i + 1 == parts.len() {
                map.insert(part.clone(), v);
                break;
            }
            node = map
                .entry(part.clone())
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
}
