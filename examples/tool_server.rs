//! A tool served over HTTP through the toolshield stack, with `/healthz`, `/metrics` and
//! the breaker admin API, on 127.0.0.1.
//!
//! `cargo run --example tool_server` starts the server on a free port, calls it a few
//! times as a client would (a tool call, a cached repeat, an invalid payload, health,
//! metrics, the admin API, live reloads), prints what came back, and exits.
//! `cargo run --example tool_server -- --serve [--config PATH]` keeps serving on
//! 127.0.0.1:8080 until Ctrl-C (try `curl -XPOST localhost:8080/tools/weather -H
//! 'content-type: application/json' -d '{"city":"Paris"}'`: the body is read with axum's
//! `Json`, which answers 415 without that header; and the CLI:
//! `TOOLSHIELD_ADMIN_TOKEN=demo-token toolshield breakers status`).
//!
//! The configuration lives in a file (`--config PATH`, else a copy of the one below in the
//! temporary directory). The server reloads it when its modification time changes (polled
//! every second), on `SIGHUP` (Unix), and on `POST /admin/reload` (docs/reload.md): edit
//! the file, or `kill -HUP <pid>`, or `curl -XPOST -H 'authorization: Bearer demo-token'
//! localhost:8080/admin/reload`.

use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, SystemTime};

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use toolshield::core::ConfigError;
use toolshield::prelude::*;
use toolshield_axum::{ReloadSource, ShieldRouter};
use tower::{service_fn, BoxError, ServiceExt};

const CONFIG: &str = r#"
[defaults]
timeout = { attempt = "2s", soft = "500ms" }

[tools.weather]
kind = "read_only"
cache = { ttl = "1m" }

# Breaker settings of its own: `weather` gets its own breaker registry, next to `default`.
[tools.weather.breaker]
consecutive_failures = 3
open_wait = "10s"

[tools.weather.schema]
type = "object"
required = ["city"]
properties = { city = { type = "string", minLength = 1 } }
"#;

const ADMIN_TOKEN: &str = "demo-token";

/// `POST /tools/{name}` with the arguments as the JSON body: the never-throw envelope back.
async fn call_tool(
    State(router): State<ToolRouter>,
    Path(tool): Path<String>,
    Json(payload): Json<Value>,
) -> Json<ToolResult> {
    let req = ToolRequest::new(tool, payload).kind(CallKind::ReadOnly);
    Json(router.oneshot(req).await.into())
}

/// Reloads `shield` from the file at `path`; a configuration with problems is refused
/// (every problem logged) and the running one stays.
fn reload_from(shield: &Shield, path: &FsPath, why: &str) {
    match ShieldConfig::load(path).and_then(|config| shield.reload(config)) {
        Ok(s) => println!(
            "[reload: {why}] generation {}: added {:?}, removed {:?}, changed {:?}, breaker settings kept {:?}, flow settings kept {:?}, runs kept {}",
            s.generation,
            s.added,
            s.removed,
            s.changed,
            s.breaker_settings_kept,
            s.flow_settings_kept,
            s.runs_kept
        ),
        Err(e) => eprintln!("[reload: {why}] refused, the running configuration stays: {e}"),
    }
}

/// The file's modification time and length: what the watcher compares.
fn stamp(path: &FsPath) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Polls the file every second; reloads when it changed. No watcher crate needed.
async fn watch_file(shield: Shield, path: PathBuf) {
    let mut last = stamp(&path);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let now = stamp(&path);
        if now != last {
            last = now;
            if now.is_some() {
                reload_from(&shield, &path, "file changed");
            }
        }
    }
}

/// Reloads on every `SIGHUP`.
#[cfg(unix)]
async fn reload_on_sighup(shield: Shield, path: PathBuf) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("no SIGHUP reload: {e}");
            return;
        }
    };
    while hangups.recv().await.is_some() {
        reload_from(&shield, &path, "SIGHUP");
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let serve = args.iter().any(|a| a == "--serve");
    let given = (args.iter())
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let path = match &given {
        Some(path) => path.clone(),
        None => {
            let path = std::env::temp_dir().join(format!(
                "toolshield-tool-server-{}.toml",
                std::process::id()
            ));
            std::fs::write(&path, CONFIG)?;
            path
        }
    };
    println!("configuration file {}", path.display());

    let exporter = toolshield_metrics::local_prometheus();
    let shield = Shield::from_config(ShieldConfig::load(&path)?)?.with_metrics(&exporter)?;
    let weather = service_fn(|req: ToolRequest| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, ToolError>(ToolResponse::new(
            json!({"city": req.payload()["city"], "temp_c": 21}),
        ))
    });
    let tools = shield.router().tool("weather", weather).build()?;

    tokio::spawn(watch_file(shield.clone(), path.clone()));
    #[cfg(unix)]
    tokio::spawn(reload_on_sighup(shield.clone(), path.clone()));

    let reload = {
        let (shield, path) = (shield.clone(), path.clone());
        move |source: ReloadSource| -> Result<Value, ConfigError> {
            let config = match source {
                ReloadSource::Toml(text) => ShieldConfig::from_toml_str(&text)?,
                ReloadSource::Json(text) => ShieldConfig::from_json_str(&text)?,
                // No body: the file the server was started with.
                _ => ShieldConfig::load(&path)?,
            };
            let summary = shield.reload(config)?;
            serde_json::to_value(summary).map_err(|e| ConfigError::single("", e))
        }
    };
    let ops = ShieldRouter::new()
        .core_check("tools", || async { Ok::<(), String>(()) })
        .metrics(exporter)
        // Every breaker registry of the shield (`default` and `weather`), in one call.
        .breakers(shield.breakers())
        .admin_token(ADMIN_TOKEN)
        .reload_with(reload)
        .build();
    let app = Router::new()
        .route("/tools/{name}", post(call_tool))
        .with_state(tools)
        .merge(ops);

    let addr = if serve {
        "127.0.0.1:8080"
    } else {
        "127.0.0.1:0"
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let url = format!("http://{}", listener.local_addr()?);
    println!("tool server on {url}");
    if serve {
        axum::serve(listener, app).await?;
        return Ok(());
    }
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Play the client, with a blocking HTTP client on a blocking thread.
    let tour_path = path.clone();
    let result = tokio::task::spawn_blocking(move || {
        client_tour(&url)?;
        reload_tour(&url, &shield, &tour_path)
    })
    .await;
    if given.is_none() {
        let _ = std::fs::remove_file(&path);
    }
    result??;
    Ok(())
}

fn client_tour(url: &str) -> Result<(), BoxError> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let post = |path: &str, body: &str, token: Option<&str>| -> Result<(u16, String), BoxError> {
        let mut req = agent
            .post(&format!("{url}{path}"))
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        let mut res = req.send(body)?;
        Ok((res.status().as_u16(), res.body_mut().read_to_string()?))
    };
    let get = |path: &str, token: Option<&str>| -> Result<(u16, String), BoxError> {
        let mut req = agent.get(&format!("{url}{path}"));
        if let Some(t) = token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        let mut res = req.call()?;
        Ok((res.status().as_u16(), res.body_mut().read_to_string()?))
    };

    let (status, body) = post("/tools/weather", r#"{"city":"Paris"}"#, None)?;
    println!("\nPOST /tools/weather {{\"city\":\"Paris\"}}  -> {status} {body}");
    let (status, body) = post("/tools/weather", r#"{"city":"Paris"}"#, None)?;
    println!("same call again (cached)               -> {status} {body}");
    let (status, body) = post("/tools/weather", r#"{"town":"Paris"}"#, None)?;
    println!("invalid arguments                      -> {status} {body}");
    let (status, body) = post("/tools/stocks", r#"{}"#, None)?;
    println!("unknown tool                           -> {status} {body}");

    let (status, body) = get("/healthz", None)?;
    println!("\nGET /healthz -> {status} {body}");
    let (status, body) = get("/metrics", None)?;
    println!(
        "GET /metrics -> {status}, {} lines, e.g.:",
        body.lines().count()
    );
    for line in body
        .lines()
        .filter(|l| l.starts_with("tool_execution_total"))
    {
        println!("  {line}");
    }

    let (status, _) = get("/admin/breakers", None)?;
    println!("\nGET /admin/breakers without a token -> {status}");
    let (status, _) = post("/admin/breakers/weather/open", "", Some(ADMIN_TOKEN))?;
    println!("POST /admin/breakers/weather/open   -> {status}");
    let (status, body) = post("/tools/weather", r#"{"city":"Rome"}"#, None)?;
    println!("a weather call while forced open     -> {status} {body}");
    let (status, body) = post("/admin/breakers/wether/open", "", Some(ADMIN_TOKEN))?;
    println!("POST /admin/breakers/wether/open    -> {status} {body}");
    let (status, body) = get("/healthz", None)?;
    println!("GET /healthz (counts, never keys)   -> {status} {body}");
    let (status, _) = post("/admin/breakers/all/reset", "", Some(ADMIN_TOKEN))?;
    println!("POST /admin/breakers/all/reset      -> {status}");
    let (status, body) = post("/tools/weather", r#"{"city":"Rome"}"#, None)?;
    println!("and again after the reset           -> {status} {body}");
    Ok(())
}

fn reload_tour(url: &str, shield: &Shield, path: &FsPath) -> Result<(), BoxError> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let reload = |content_type: &str, body: &str| -> Result<(u16, String), BoxError> {
        let mut res = agent
            .post(&format!("{url}/admin/reload"))
            .header("authorization", &format!("Bearer {ADMIN_TOKEN}"))
            .header("content-type", content_type)
            .send(body)?;
        Ok((res.status().as_u16(), res.body_mut().read_to_string()?))
    };

    let longer_cache = CONFIG.replace(r#"cache = { ttl = "1m" }"#, r#"cache = { ttl = "5m" }"#);
    let (status, body) = reload("application/toml", &longer_cache)?;
    println!("\nPOST /admin/reload (TOML body, cache 5m) -> {status} {body}");
    let (status, body) = reload(
        "application/toml",
        "[tools.weather]\nretry = { max_attempts = 0 }\ntimeout = { attempt = \"0s\" }\n",
    )?;
    println!("POST /admin/reload (invalid)            -> {status} {body}");

    // The file watcher: change the file, and the server reloads within a second or two.
    let before = shield.generation();
    std::fs::write(path, CONFIG.replace(r#"ttl = "1m""#, r#"ttl = "2m""#))?;
    let waited = std::time::Instant::now();
    while shield.generation() == before && waited.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "the file changed: generation {before} -> {} (cache ttl now {:?})",
        shield.generation(),
        shield.config().tools["weather"].cache.ttl
    );
    let (status, body) = reload("application/toml", "")?;
    println!("POST /admin/reload (no body: the file)  -> {status} {body}");
    Ok(())
}
