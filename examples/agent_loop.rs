//! A scripted agent loop (no real model) that calls several tools through one
//! `ToolRouter`: a local tool, the tools of an MCP server (`weather__forecast`), a tool
//! that keeps failing, a tool nobody registered, and two long tools that report progress
//! under an idle timeout: `crawl` keeps reporting and finishes although it runs longer
//! than the idle limit, `export` goes silent and is cut. Progress reaches the "UI" through
//! the request's callback and ends up in provenance. Every error goes back to the "model"
//! as `ToolError::for_model` text; the loop never crashes.
//!
//! `cargo run --example agent_loop`

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use std::time::Duration;

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

# Long tools: cut after 150 ms without progress, never after more than 2 s.
[tools.crawl]
timeout = { attempt = "2s", idle = "150ms" }

[tools.export]
timeout = { attempt = "2s", idle = "150ms" }
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
        ("crawl", json!({"site": "docs.example.org", "pages": 6})),
        ("export", json!({"table": "orders"})),
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

    // Reports a page every 60 ms: 360 ms in all, well past the 150 ms idle limit.
    let crawl = service_fn(|req: ToolRequest| async move {
        let pages = req.payload()["pages"].as_u64().unwrap_or(1).min(20);
        for page in 1..=pages {
            tokio::time::sleep(Duration::from_millis(60)).await;
            req.progress().report(
                page as f64,
                pages as f64,
                Some(&format!("crawled page {page}")),
            );
        }
        Ok::<_, ToolError>(ToolResponse::new(json!({"pages": pages})))
    });
    // Reports twice, then hangs: the idle limit cuts it long before the 2 s maximum.
    let export = service_fn(|req: ToolRequest| async move {
        for step in 1..=2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            req.progress()
                .report(f64::from(step), None, Some("exporting"));
        }
        std::future::pending::<()>().await;
        Ok::<_, ToolError>(ToolResponse::new(json!("never")))
    });

    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG)?)?;
    let router = shield
        .router()
        .tool("calculator", calculator)
        .tool("search", search)
        .tool("crawl", crawl)
        .tool("export", export)
        .server("weather", weather)
        .build()?;

    // The "conversation": what the model would read after each tool call.
    let mut transcript: Vec<String> = Vec::new();
    for (step, (tool, args)) in plan().into_iter().enumerate() {
        // The agent UI's progress bar: every report of every attempt.
        let req = ToolRequest::new(tool, args)
            .kind(CallKind::ReadOnly)
            .on_progress(move |e| {
                let done = e.progress.unwrap_or_default();
                match e.total {
                    Some(total) => print!("  [{tool} attempt {}] {done}/{total}", e.attempt),
                    None => print!("  [{tool} attempt {}] {done}", e.attempt),
                }
                println!(" {}", e.message.unwrap_or(""));
            });
        let text = match router.clone().oneshot(req).await {
            Ok(res) if res.provenance.progress_reports > 0 => format!(
                "tool `{tool}` returned {} after {} progress reports (last: {:?})",
                res.output,
                res.provenance.progress_reports,
                res.provenance.progress_message.as_deref().unwrap_or("")
            ),
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
