//! An in-process rmcp server for the tests: scripted tools, call counters.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use tokio::task::JoinHandle;
use toolshield_mcp::McpClientService;

/// What the server saw.
#[derive(Default, Debug)]
pub struct Seen {
    pub flaky: AtomicU32,
    pub broken: AtomicU32,
    pub hang: AtomicU32,
    pub echo: AtomicU32,
    pub vanish: AtomicU32,
}

/// The scripted server:
/// - `flaky`: `isError: true` ("upstream busy") twice, then success;
/// - `broken`: always `isError: true`;
/// - `hang`: never answers (until the client cancels the request);
/// - `echo`: returns its arguments as text and as structured content;
/// - `strict`: invalid params unless `{"n": <number>}`;
/// - `vanish`: the server shuts down mid-call (its transport closes), never answering;
/// - `huge_error`: a JSON-RPC error whose message is 1 MiB;
/// - anything else: "tool not found" (invalid params, as rmcp's own router says it).
#[derive(Clone, Default)]
pub struct TestServer {
    pub seen: Arc<Seen>,
    /// Cancelled by `vanish`: the server task drops the running server.
    pub kill: tokio_util::sync::CancellationToken,
}

impl ServerHandler for TestServer {
    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = serde_json::Value::from(req.arguments.clone().unwrap_or_default());
        match &*req.name {
            "flaky" => {
                let n = self.seen.flaky.fetch_add(1, Ordering::SeqCst) + 1;
                if n <= 2 {
                    Ok(CallToolResult::error(vec![ContentBlock::text("upstream busy")]).into())
                } else {
                    Ok(
                        CallToolResult::success(vec![ContentBlock::text(format!("ok after {n}"))])
                            .into(),
                    )
                }
            }
            "broken" => {
                self.seen.broken.fetch_add(1, Ordering::SeqCst);
                Ok(CallToolResult::error(vec![ContentBlock::text("disk full")]).into())
            }
            "hang" => {
                self.seen.hang.fetch_add(1, Ordering::SeqCst);
                cx.ct.cancelled().await;
                Err(ErrorData::internal_error("cancelled", None))
            }
            "vanish" => {
                self.seen.vanish.fetch_add(1, Ordering::SeqCst);
                self.kill.cancel();
                std::future::pending().await
            }
            "huge_error" => Err(ErrorData::internal_error("x".repeat(1 << 20), None)),
            "echo" => {
                self.seen.echo.fetch_add(1, Ordering::SeqCst);
                Ok(CallToolResult::structured(args).into())
            }
            "strict" => match args.get("n").and_then(serde_json::Value::as_f64) {
                Some(n) => {
                    Ok(CallToolResult::success(vec![ContentBlock::text(n.to_string())]).into())
                }
                None => Err(ErrorData::invalid_params("`n` must be a number", None)),
            },
            _ => Err(ErrorData::invalid_params("tool not found", None)),
        }
    }
}

/// Starts the server on one half of an in-memory duplex pipe and connects a client on
/// the other. Aborting the returned task kills the server.
pub async fn start() -> (McpClientService, Arc<Seen>, JoinHandle<()>) {
    let server = TestServer::default();
    let seen = server.seen.clone();
    let kill = server.kill.clone();
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let task = tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            // Dropping the running server closes its end of the pipe.
            tokio::select! {
                _ = running.waiting() => {}
                () = kill.cancelled() => {}
            }
        }
    });
    let client = McpClientService::connect(client_io)
        .await
        .expect("client connects to the in-process server");
    (client, seen, task)
}

/// Waits (at most 600 s of the paused clock) until `done` holds, checking again each time
/// `changed` is notified; panics naming `what` if it never does.
pub async fn until(changed: &tokio::sync::Notify, what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(std::time::Duration::from_secs(600), async {
        loop {
            let notified = changed.notified();
            if done() {
                return;
            }
            notified.await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server never saw: {what}"));
}

/// Runs `server` on one half of an in-memory duplex pipe until the client goes, and
/// connects a client on the other half.
pub async fn connect_to<H: ServerHandler>(server: H) -> McpClientService {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    McpClientService::connect(client_io)
        .await
        .expect("client connects")
}

/// The unsigned integer argument `key` of a scripted call (0 when absent).
pub fn arg_u64(args: &serde_json::Value, key: &str) -> u64 {
    args.get(key)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

/// A successful answer: one text block, `done`.
pub fn done() -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text("done")]).into()
}
