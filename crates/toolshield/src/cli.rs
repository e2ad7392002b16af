//! The `toolshield` command line: breaker status and manual control through the admin
//! API of `toolshield-axum`.
//!
//! ```text
//! toolshield [--url URL] [--token TOKEN] [--json] breakers status [KEY] [--registry NAME]
//! toolshield [--url URL] [--token TOKEN] [--json] breakers open|close|metrics-only|reset KEY|all [--create] [--registry NAME]
//! ```
//!
//! `--url` defaults to `$TOOLSHIELD_URL`, else `http://127.0.0.1:8080`; `--token` to
//! `$TOOLSHIELD_ADMIN_TOKEN`. The output is a table, or the server's JSON with `--json`.
//! A key the server does not hold is an error (404) unless `--create` is given. An answer
//! is a success only if it confirms the request (the key, the action, the breakers in
//! their new state): a `200 {}` from something else on that port is a failure.
//! Exit codes: 0 success, 1 the server refused, failed or did not confirm (401, 404, 5xx),
//! 2 usage error, 3 the server could not be reached.

use std::ffi::OsString;
use std::io::Write;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::Value;

/// Exit code: the server answered with an error, or an answer that does not confirm the
/// request.
pub const EXIT_FAILED: i32 = 1;
/// Exit code: the command line was wrong.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the admin API could not be reached.
pub const EXIT_UNREACHABLE: i32 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "toolshield",
    version,
    about = "Operate toolshield circuit breakers through the admin API"
)]
struct Cli {
    /// Base URL of the service exposing /admin/breakers.
    #[arg(
        long,
        env = "TOOLSHIELD_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    url: String,
    /// Bearer token of the admin API.
    #[arg(
        long,
        env = "TOOLSHIELD_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// Print the server's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Request timeout in seconds (1 to 86,400).
    #[arg(
        long,
        default_value_t = 10,
        global = true,
        value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS)
    )]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Circuit breakers.
    #[command(subcommand)]
    Breakers(Breakers),
}

#[derive(Debug, Subcommand)]
enum Breakers {
    /// Shows every breaker, or one.
    Status {
        /// A breaker key (the tool name by default).
        key: Option<String>,
        /// Only the breaker registry of this name (`default`, or a tool with breaker
        /// settings of its own).
        #[arg(long)]
        registry: Option<String>,
    },
    /// Forces a breaker open (`all` for every breaker): calls fail fast with CIRCUIT_OPEN.
    Open(Target),
    /// Forces a breaker closed (disabled): calls pass, it never trips.
    Close(Target),
    /// Shadow mode: the breaker records and reports, never rejects.
    MetricsOnly(Target),
    /// Back to a fresh closed breaker, override lifted.
    Reset(Target),
}

/// The breakers an action applies to.
#[derive(Debug, Args)]
struct Target {
    /// A breaker key, or `all` for every breaker of every registry.
    key: String,
    /// Create the breaker if the server holds none with this key (to pre-open a key not
    /// seen yet); without it an unknown key is an error.
    #[arg(long)]
    create: bool,
    /// Only the breaker registry of this name; with `--create`, the registry the breaker
    /// is created in.
    #[arg(long)]
    registry: Option<String>,
}

impl Breakers {
    /// The subcommand: `status`, or the action's path segment.
    const fn verb(&self) -> &'static str {
        match self {
            Breakers::Status { .. } => "status",
            Breakers::Open(_) => "open",
            Breakers::Close(_) => "close",
            Breakers::MetricsOnly(_) => "metrics-only",
            Breakers::Reset(_) => "reset",
        }
    }
}

/// Runs the command line with `args` (the program name first), writing to stdout and
/// stderr; returns the exit code.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    run_with(args, &mut stdout.lock(), &mut stderr.lock())
}

/// [`run`], writing to `out` and `err`.
pub fn run_with<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let text = e.render().to_string();
            let _ = if e.use_stderr() {
                err.write_all(text.as_bytes())
            } else {
                out.write_all(text.as_bytes())
            };
            return code;
        }
    };
    match execute(&cli) {
        Ok(body) => {
            let printed = if cli.json {
                serde_json::to_string_pretty(&body)
                    .map(|s| writeln!(out, "{s}"))
                    .is_ok()
            } else {
                write_table(out, &body).is_ok()
            };
            if printed {
                0
            } else {
                EXIT_FAILED
            }
        }
        Err((code, message)) => {
            let _ = writeln!(err, "error: {message}");
            code
        }
    }
}

type Failure = (i32, String);

/// The longest `--timeout` (a day): an admin request that needs longer is not answering.
const MAX_TIMEOUT_SECS: u64 = 86_400;

/// Why `base` (the `--url` without trailing slashes) cannot be the admin API's address,
/// if it cannot: not http(s), no host, a port that is not a number from 0 to 65535, or
/// anything else the HTTP client could not parse. Such a URL is a usage error, not an
/// unreachable server.
fn url_problem(base: &str) -> Option<&'static str> {
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Some("expected http://host:port");
    }
    let Ok(uri) = base.parse::<ureq::http::Uri>() else {
        return Some("not a URL");
    };
    let Some(authority) = uri.authority() else {
        return Some("no host");
    };
    if uri.host().is_none_or(str::is_empty) {
        return Some("no host");
    }
    // The port, where one is written: after the last `:` that is not inside an IPv6
    // literal's brackets.
    let hostport = authority.as_str().rsplit('@').next().unwrap_or_default();
    let port = match hostport.rfind([':', ']']) {
        Some(i) if hostport.as_bytes().get(i) == Some(&b':') => Some(&hostport[i + 1..]),
        _ => None,
    };
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Some("the port must be a number from 0 to 65535");
    }
    None
}

fn execute(cli: &Cli) -> Result<Value, Failure> {
    let base = cli.url.trim_end_matches('/');
    if let Some(why) = url_problem(base) {
        return Err((EXIT_USAGE, format!("invalid --url `{}`: {why}", cli.url)));
    }
    // Surrounding whitespace is not part of a token, as on the server (a secret read from
    // a file keeps its newline).
    let Some(token) = cli
        .token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    else {
        return Err((
            EXIT_USAGE,
            "no admin token: pass --token or set TOOLSHIELD_ADMIN_TOKEN".to_owned(),
        ));
    };
    // A token ureq cannot put in a header (a pasted newline) is the user's mistake, not
    // an unreachable server. The token itself is never echoed.
    if ureq::http::HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
        return Err((
            EXIT_USAGE,
            "the admin token contains a character that cannot be sent in a header (a newline or another control character?)"
                .to_owned(),
        ));
    }
    let Command::Breakers(command) = &cli.command;
    let key = match command {
        Breakers::Status { key, .. } => key.as_deref(),
        Breakers::Open(t) | Breakers::Close(t) | Breakers::MetricsOnly(t) | Breakers::Reset(t) => {
            Some(t.key.as_str())
        }
    };
    if key == Some("") {
        return Err((
            EXIT_USAGE,
            "the breaker key is empty: give a key, or `all`".to_owned(),
        ));
    }
    let (method_post, path, create, registry) = match command {
        Breakers::Status { key, registry } => (
            false,
            match key {
                None => "/admin/breakers".to_owned(),
                Some(k) => format!("/admin/breakers/{}", encode(k)),
            },
            false,
            registry.as_deref(),
        ),
        Breakers::Open(t) | Breakers::Close(t) | Breakers::MetricsOnly(t) | Breakers::Reset(t) => (
            true,
            format!("/admin/breakers/{}/{}", encode(&t.key), command.verb()),
            t.create,
            t.registry.as_deref(),
        ),
    };
    let mut query = Vec::new();
    if create {
        query.push("create=true".to_owned());
    }
    if let Some(r) = registry {
        query.push(format!("registry={}", encode(r)));
    }
    let path = if query.is_empty() {
        path
    } else {
        format!("{path}?{}", query.join("&"))
    };
    let url = format!("{base}{path}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(
            cli.timeout.clamp(1, MAX_TIMEOUT_SECS),
        )))
        .build()
        .into();
    let auth = format!("Bearer {token}");
    let sent = if method_post {
        agent.post(&url).header("authorization", &auth).send_empty()
    } else {
        agent.get(&url).header("authorization", &auth).call()
    };
    let mut resp = sent.map_err(|e| {
        (
            EXIT_UNREACHABLE,
            format!("cannot reach the admin API at {base}: {e}"),
        )
    })?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    let body: Option<Value> = serde_json::from_str(&text).ok();
    if status == 401 {
        return Err((
            EXIT_FAILED,
            "unauthorized: the admin token was refused (check --token or TOOLSHIELD_ADMIN_TOKEN)"
                .to_owned(),
        ));
    }
    if !(200..300).contains(&status) {
        let detail = body
            .as_ref()
            .and_then(|b| b.get("error"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| {
                if status == 404 {
                    "not found (is the admin API mounted? it needs a token on the server)"
                        .to_owned()
                } else {
                    format!(
                        "unexpected answer: {}",
                        text.chars().take(200).collect::<String>()
                    )
                }
            });
        // The server's hint names its query parameter; name the flag.
        let hint = if status == 404 && !create && detail.contains("create=true") {
            " (to create a breaker for a key not seen yet, pass --create)"
        } else {
            ""
        };
        return Err((
            EXIT_FAILED,
            format!("{url} answered {status}: {detail}{hint}"),
        ));
    }
    let body =
        body.ok_or_else(|| (EXIT_FAILED, format!("{url} answered {status} without JSON")))?;
    confirms(command, &body).map_err(|why| {
        (
            EXIT_FAILED,
            format!("{url} answered {status} but did not confirm the request: {why}"),
        )
    })?;
    Ok(body)
}

/// Whether `body` is the answer the admin API gives to `command` once it is done: the
/// key and action echoed, and for one key, its breakers listed in the state the action
/// puts them in.
fn confirms(command: &Breakers, body: &Value) -> Result<(), String> {
    let list = body
        .get("breakers")
        .and_then(Value::as_array)
        .ok_or("no `breakers` list")?;
    let all_have_key = |key: &str| {
        list.iter()
            .all(|b| b.get("key").and_then(Value::as_str) == Some(key))
    };
    let echoed = |field: &str, want: &str| -> Result<(), String> {
        match body.get(field).and_then(Value::as_str) {
            Some(got) if got == want => Ok(()),
            Some(got) => Err(format!("`{field}` is `{got}`, expected `{want}`")),
            None => Err(format!("no `{field}`")),
        }
    };
    match command {
        Breakers::Status { key: None, .. } => Ok(()),
        Breakers::Status { key: Some(key), .. } => {
            echoed("key", key)?;
            if list.is_empty() || !all_have_key(key) {
                return Err(format!("no breaker `{key}` listed"));
            }
            Ok(())
        }
        Breakers::Open(target)
        | Breakers::Close(target)
        | Breakers::MetricsOnly(target)
        | Breakers::Reset(target) => {
            let action = command.verb();
            echoed("action", action)?;
            echoed("key", &target.key)?;
            if target.key == "all" {
                // Every breaker held: possibly none, and a breaker created by a call since
                // may already show its own state.
                return Ok(());
            }
            if list.is_empty() || !all_have_key(&target.key) {
                return Err(format!("no breaker `{}` listed", target.key));
            }
            let expected: &[&str] = match action {
                "open" => &["forced_open"],
                "close" => &["disabled"],
                "metrics-only" => &["metrics_only"],
                // No override left: a fresh closed breaker (a call may have moved it on).
                _ => &["closed", "open", "half_open"],
            };
            for b in list {
                let state = b.get("state").and_then(Value::as_str).unwrap_or("-");
                if !expected.contains(&state) {
                    return Err(format!("breaker `{}` is `{state}`", target.key));
                }
            }
            Ok(())
        }
    }
}

/// Percent-encodes a breaker key for a path segment.
fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.1}"),
            _ => n.to_string(),
        },
        Some(other) => other.to_string(),
    }
}

/// The breakers of a response: `{"breakers":[...]}`.
fn breakers(body: &Value) -> Vec<&Value> {
    body.get("breakers")
        .and_then(Value::as_array)
        .map(|list| list.iter().collect())
        .unwrap_or_default()
}

fn write_table(out: &mut dyn Write, body: &Value) -> std::io::Result<()> {
    if let (Some(action), Some(key)) = (
        body.get("action").and_then(Value::as_str),
        body.get("key").and_then(Value::as_str),
    ) {
        let created = if body.get("created").and_then(Value::as_bool) == Some(true) {
            " (created)"
        } else {
            ""
        };
        writeln!(out, "{action}: {key}{created}")?;
    }
    let rows = breakers(body);
    if rows.is_empty() {
        return writeln!(out, "no breakers");
    }
    const HEAD: [&str; 8] = [
        "KEY",
        "REGISTRY",
        "STATE",
        "FAILURE_RATE%",
        "CALLS",
        "CONSECUTIVE",
        "REJECTED",
        "HALF_OPEN_IN",
    ];
    const FIELDS: [&str; 8] = [
        "key",
        "registry",
        "state",
        "failure_rate",
        "calls_in_window",
        "consecutive_failures",
        "rejections",
        "time_until_half_open",
    ];
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|b| FIELDS.iter().map(|f| cell(b.get(*f))).collect())
        .collect();
    let widths: Vec<usize> = (0..HEAD.len())
        .map(|i| {
            table
                .iter()
                .map(|r| r[i].len())
                .chain([HEAD[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[&str]| -> String {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        parts.join("  ").trim_end().to_owned()
    };
    writeln!(out, "{}", line(&HEAD))?;
    for r in &table {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        writeln!(out, "{}", line(&cells))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::url_problem;

    #[test]
    fn an_address_with_a_host_and_a_port_that_fits_is_accepted() {
        for url in [
            "http://127.0.0.1:8080",
            "https://admin.example.com",
            "http://[::1]:8080",
            "http://[::1]",
            "http://user@host:65535",
            "http://host:0/prefix",
        ] {
            assert_eq!(url_problem(url), None, "{url}");
        }
    }

    #[test]
    fn an_address_that_cannot_be_dialled_is_named_a_usage_problem() {
        for url in [
            "ftp://host",
            "http://",
            "http://:8080",
            "http://host:",
            "http://host:65536",
            "http://host:port",
            "http://[::1]:99999",
            "http://exa mple.com",
            "http://[::1",
        ] {
            assert!(url_problem(url).is_some(), "{url}");
        }
    }
}
