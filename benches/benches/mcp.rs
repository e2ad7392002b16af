//! An MCP tool call through `toolshield-mcp` over an in-memory duplex pipe to an
//! in-process rmcp server, bare and behind the default stack, against the bare service.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt as _};
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_benches::{payload_200b, BareTool};
use toolshield_core::{CallKind, ToolRequest};
use toolshield_mcp::McpClientService;
use tower::{Service, ServiceExt};

struct Echo;

impl ServerHandler for Echo {
    async fn call_tool(
        &self,
        _req: CallToolRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text("ok")]).into())
    }
}

fn read(payload: &serde_json::Value) -> ToolRequest {
    ToolRequest::new("echo", payload.clone()).kind(CallKind::ReadOnly)
}

fn mcp_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let payload = payload_200b();
    let client = rt.block_on(async {
        let (server_io, client_io) = tokio::io::duplex(256 * 1024);
        tokio::spawn(async move {
            if let Ok(running) = Echo.serve(server_io).await {
                let _ = running.waiting().await;
            }
        });
        McpClientService::connect(client_io).await.expect("connect")
    });
    let mut g = c.benchmark_group("mcp_call");

    let mut bare = BareTool::new();
    g.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| {
            let fut = bare.call(read(&payload));
            async move { black_box(fut.await) }
        })
    });

    let mut mcp = client.clone();
    g.bench_function("mcp-duplex", |b| {
        b.to_async(&rt).iter(|| {
            let fut = mcp.call(read(&payload));
            async move { black_box(fut.await.expect("echo")) }
        })
    });

    let shield = Shield::from_config(ShieldConfig::default()).expect("default shield");
    let shielded = shield.wrap("echo", client);
    g.bench_function("mcp-duplex-default-stack", |b| {
        b.to_async(&rt).iter(|| {
            let svc = shielded.clone();
            let req = read(&payload);
            async move { black_box(svc.oneshot(req).await.expect("echo")) }
        })
    });
    g.finish();
}

criterion_group!(benches, mcp_call);
criterion_main!(benches);
