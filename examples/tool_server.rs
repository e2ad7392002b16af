//! A tool served over HTTP through the toolshield stack, with `/healthz`, `/metrics` and
//! the breaker admin API, on 127.0.0.1.
//!
//! `cargo run --example tool_server` starts the server on a free port, calls it a few
//! times as a client would (a tool call, a cached repeat, an invalid payload, health,
//! metrics, the admin API), prints what came back, and exits.
//! `cargo run --example tool_server -- --serve` keeps serving on 127.0.0.1:8080 until
//! Ctrl-C (try `curl -XPOST localhost:8080/tools/weather -d '{"city":"Paris"}'`, and the
//! CLI: `TOOLSHIELD_ADMIN_TOKEN=demo-token toolshield breakers status`).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use toolshield::prelude::*;
use toolshield_axum::ShieldRouter;
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

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let serve = std::env::args().any(|a| a == "--serve");

    let exporter = toolshield_metrics::local_prometheus();
    let shield =
        Shield::from_config(ShieldConfig::from_toml_str(CONFIG)?)?.with_metrics(&exporter)?;
    let weather = service_fn(|req: ToolRequest| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, ToolError>(ToolResponse::new(
            json!({"city": req.payload()["city"], "temp_c": 21}),
        ))
    });
    let tools = shield.router().tool("weather", weather).build()?;

    let ops = ShieldRouter::new()
        .core_check("tools", || async { Ok::<(), String>(()) })
        .metrics(exporter)
        // Every breaker registry of the shield (`default` and `weather`), in one call.
        .breakers(shield.breakers())
        .admin_token(ADMIN_TOKEN)
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
    tokio::task::spawn_blocking(move || client_tour(&url)).await??;
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
