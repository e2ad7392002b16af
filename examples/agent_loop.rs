//! A scripted agent loop (no real model) that calls several tools through one
//! `ToolRouter`: a local tool, the tools of an MCP server (`weather__forecast`), a tool
//! that keeps failing and a tool nobody registered. Every error goes back to the "model"
//! as `ToolError::for_model` text; the loop never crashes.
//!
//! `cargo run --example agent_loop`

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use toolshield::prelude::*;
use toolshield::shield::Shield;
use toolshield_mcp::McpClientService;
use tower::{service_fn, ServiceExt as _};

/// Short waits so the demo finishes at once.
const CONFIG: &str = r#"
[defaults]
kind = "read_only"
timeout = { attempt = "1s", soft = "500ms" }
retry = { max_attempts = 2, backoff = { strategy = "exponential", base = "20ms", factor = 2.0, cap = "100ms" } }
breaker = { consecutive_failures = 2, open_wait = "30s" }
"#;

/// The MCP server: `forecast` answers, `alerts` reports an error (`isError: true`).
struct WeatherServer;

impl ServerHandler for WeatherServer {
    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let city = req
            .arguments
            .as_ref()
            .and_then(|a| a.get("city"))
            .and_then(Value::as_str)
            .unwrap_or("nowhere")
            .to_owned();
        match &*req.name {
            "forecast" => Ok(CallToolResult::structured(json!({"city": city, "temp": 18})).into()),
            "alerts" => Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "no alert feed for {city}"
            ))])
            .into()),
            _ => Err(ErrorData::invalid_params("tool not found", None)),
        }
    }
}

/// What the scripted "model" decides to call, in order.
fn plan() -> Vec<(&'static str, Value)> {
    vec![
        ("calculator", json!({"a": 6, "b": 7})),
        ("weather__forecast", json!({"city": "Lyon"})),
        ("weather__alerts", json!({"city": "Lyon"})),
        ("search", json!({"q": "umbrellas"})),
        ("search", json!({"q": "raincoats"})),
        ("search", json!({"q": "boots"})),
        ("translate", json!({"text": "bonjour"})),
        ("weather__nope", json!({})),
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = WeatherServer.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let weather = McpClientService::connect(client_io)
        .await?
        .with_server("weather");

    let calculator = service_fn(|req: ToolRequest| async move {
        let a = req.payload()["a"].as_f64();
        let b = req.payload()["b"].as_f64();
        match (a, b) {
            (Some(a), Some(b)) => Ok(ToolResponse::new(json!({"product": a * b}))),
            _ => Err(ToolError::invalid_input("`a` and `b` must be numbers")),
        }
    });
    let search = service_fn(|_req: ToolRequest| async move {
        Err::<ToolResponse, _>(ToolError::new(
            ErrorKind::UpstreamUnavailable,
            "search backend returned 503",
        ))
    });

    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG)?)?;
    let router = shield
        .router()
        .tool("calculator", calculator)
        .tool("search", search)
        .server("weather", weather)
        .build()?;

    // The "conversation": what the model would read after each tool call.
    let mut transcript: Vec<String> = Vec::new();
    for (step, (tool, args)) in plan().into_iter().enumerate() {
        let req = ToolRequest::new(tool, args).kind(CallKind::ReadOnly);
        let text = match router.clone().oneshot(req).await {
            Ok(res) if res.is_error() => format!(
                "tool `{tool}` reported an error: {}",
                res.output["content"][0]["text"]
            ),
            Ok(res) => format!("tool `{tool}` returned {}", res.output),
            Err(e) => e.for_model(tool),
        };
        println!("step {}: {text}", step + 1);
        transcript.push(text);
    }
    println!(
        "the agent finished {} steps without crashing; `search` breaker is {:?}",
        transcript.len(),
        shield.breaker_for("search").state("search")
    );
    Ok(())
}
