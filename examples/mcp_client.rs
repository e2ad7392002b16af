//! An MCP tool server with a flaky tool, started in-process over an in-memory pipe, called
//! through the toolshield stack with `toolshield-mcp`.
//!
//! `cargo run --example mcp_client`

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::json;
use toolshield::prelude::*;
use toolshield::shield::Shield;
use toolshield::timeout::TimeoutLayer;
use toolshield_mcp::{IsErrorPolicy, McpClientService};
use tower::{Layer as _, ServiceExt as _};

/// The stack's settings: short waits so the demo finishes at once.
const CONFIG: &str = r#"
[defaults]
kind = "read_only"
timeout = { attempt = "1s", soft = "500ms" }
retry = { max_attempts = 3, backoff = { strategy = "exponential", base = "20ms", factor = 2.0, cap = "100ms" } }
breaker = { consecutive_failures = 3, open_wait = "30s" }
"#;

/// A server with three tools: `forecast` fails twice ("busy") then answers; `broken`
/// always reports an error; `slow` works until the client cancels it.
#[derive(Clone, Default)]
struct WeatherServer {
    forecast_calls: Arc<AtomicU32>,
}

impl ServerHandler for WeatherServer {
    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match &*req.name {
            "forecast" => {
                let n = self.forecast_calls.fetch_add(1, Ordering::SeqCst) + 1;
                println!("  [server] forecast called (call #{n})");
                if n <= 2 {
                    Ok(CallToolResult::error(vec![ContentBlock::text("busy, try again")]).into())
                } else {
                    Ok(CallToolResult::structured(json!({"city": "Paris", "temp": 21})).into())
                }
            }
            "broken" => {
                println!("  [server] broken called");
                Ok(CallToolResult::error(vec![ContentBlock::text("disk full")]).into())
            }
            "slow" => {
                println!("  [server] slow called, working");
                // The request's token fires when the client's cancellation notice arrives.
                cx.ct.cancelled().await;
                println!("  [server] slow saw its cancellation and stopped");
                Err(ErrorData::internal_error("cancelled", None))
            }
            _ => Err(ErrorData::invalid_params("tool not found", None)),
        }
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _cx: NotificationContext<RoleServer>,
    ) {
        println!(
            "  [server] notifications/cancelled for request {:?}: {:?}",
            notification.request_id.map(|id| id.to_string()),
            notification.reason
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Start the MCP server on one end of an in-memory pipe.
    let server = WeatherServer::default();
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let server_task = tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });

    // 2. Connect an rmcp client and wrap it in the stack. This server's `isError`
    //    results are transient, so they become retriable UPSTREAM_UNAVAILABLE errors.
    let client = McpClientService::connect(client_io)
        .await?
        .is_error_policy(IsErrorPolicy::Error(ErrorKind::UpstreamUnavailable));
    let shield = Shield::from_config(ShieldConfig::from_toml_str(CONFIG)?)?;
    let forecast = shield.wrap("forecast", client.clone());
    let broken = shield.wrap("broken", client.clone());

    println!("1. calling the flaky `forecast` tool:");
    let req = ToolRequest::new("forecast", json!({"city": "Paris"})).kind(CallKind::ReadOnly);
    let res = forecast.clone().oneshot(req).await?;
    println!(
        "   succeeded after {} attempts: {}",
        res.provenance.attempts, res.output["structuredContent"]
    );

    println!("2. calling the `broken` tool until its breaker opens:");
    for i in 1..=4 {
        let req = ToolRequest::new("broken", json!({"n": i})).kind(CallKind::ReadOnly);
        match broken.clone().oneshot(req).await {
            Ok(res) => println!("   call {i}: unexpected success {}", res.output),
            Err(e) => println!("   call {i}: {} ({})", e.code(), e.for_model("broken")),
        }
    }
    println!(
        "   breaker for `broken` is now {:?}",
        shield.breaker_for("broken").state("broken")
    );

    println!("3. a slow tool under a 200 ms attempt timeout:");
    let slow = TimeoutLayer::new(Duration::from_millis(200)).layer(client.clone());
    let req = ToolRequest::new("slow", json!({})).kind(CallKind::ReadOnly);
    match slow.oneshot(req).await {
        Ok(res) => println!("   unexpected success {}", res.output),
        Err(e) => println!("   {}: {}", e.code(), e.message()),
    }
    // Give the server a moment to print what it saw.
    tokio::time::sleep(Duration::from_millis(50)).await;

    println!("4. the server goes away:");
    server_task.abort();
    let _ = server_task.await;
    let req = ToolRequest::new("forecast", json!({"city": "Oslo"})).kind(CallKind::ReadOnly);
    match forecast.oneshot(req).await {
        Ok(res) => println!("   unexpected success {}", res.output),
        Err(e) => println!("   {}: {}", e.code(), e.message()),
    }
    Ok(())
}
