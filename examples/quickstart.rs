//! The quickstart: an agent calls a flaky, slow tool through toolshield on in-memory
//! defaults and prints, in plain words, what happened to each call.
//!
//! Run it with `cargo run --example quickstart`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield::prelude::*;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};

/// A simulated search tool: the call number decides how it behaves, so the demo shows
/// every path without depending on luck.
fn flaky_search(
    calls: Arc<AtomicU32>,
) -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolResponse, ToolError>> + Send,
> + Clone {
    service_fn(move |req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let query = req.payload()["q"].clone();
        let token = req.attempt_token().clone();
        async move {
            let (delay, fail) = match n {
                1 => (Duration::from_millis(40), false),  // quick answer
                2 => (Duration::from_millis(250), false), // slow, past the soft threshold
                3 => (Duration::from_secs(5), false),     // hangs: hits the attempt timeout
                4 => (Duration::from_millis(10), true),   // fails
                _ => (Duration::from_secs(2), false),     // long: the user cancels it
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = token.cancelled() => return Err(ToolError::cancelled("search stopped")),
            }
            if fail {
                return Err(ToolError::new(
                    ErrorKind::UpstreamUnavailable,
                    "search backend returned 503",
                ));
            }
            Ok(ToolResponse::new(json!({"query": query, "hits": 3})))
        }
    })
}

fn describe(label: &str, result: &Result<ToolResponse, ToolError>, took: Duration) {
    let ms = took.as_millis();
    match result {
        Ok(res) if res.provenance.slow => println!(
            "  {label:<28} ok, but slow ({ms} ms, over the 200 ms soft threshold): {}",
            res.output
        ),
        Ok(res) => println!("  {label:<28} ok in {ms} ms: {}", res.output),
        Err(e) if e.kind() == ErrorKind::Timeout => {
            println!("  {label:<28} timed out after {ms} ms ({e})")
        }
        Err(e) if e.kind() == ErrorKind::Cancelled => {
            println!("  {label:<28} cancelled after {ms} ms ({e})")
        }
        Err(e) => println!("  {label:<28} failed after {ms} ms: {e}"),
    }
    if let Err(e) = result {
        println!(
            "  {:<28} the model reads: \"{}\"",
            "",
            e.for_model("search")
        );
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    println!("toolshield quickstart: one agent, one flaky tool, in-memory defaults\n");

    let calls = Arc::new(AtomicU32::new(0));
    let mut search = ServiceBuilder::new()
        .cancellable()
        .total_deadline(Duration::from_secs(3))
        .attempt_timeout(Duration::from_millis(500), Some(Duration::from_millis(200)))
        .service(flaky_search(calls.clone()));

    println!("1. timeouts and cancellation (attempt timeout 500 ms, soft threshold 200 ms)");
    for (i, label) in [
        "quick answer",
        "slow answer",
        "hanging tool",
        "failing tool",
    ]
    .into_iter()
    .enumerate()
    {
        let req = ToolRequest::new("search", json!({"q": format!("query {}", i + 1)}))
            .kind(CallKind::ReadOnly)
            .trace_id(format!("trace-{}", i + 1));
        let start = Instant::now();
        let result = search.ready().await?.call(req).await;
        describe(label, &result, start.elapsed());
    }

    let token = CancellationToken::new();
    let req = ToolRequest::new("search", json!({"q": "long query"}))
        .kind(CallKind::ReadOnly)
        .cancel_token(token.clone());
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        token.cancel();
    });
    let start = Instant::now();
    let result = search.ready().await?.call(req).await;
    describe("user cancels after 100 ms", &result, start.elapsed());
    canceller.await?;

    let envelope: ToolResult = result.into();
    println!(
        "\n  the never-throw envelope an agent gets back:\n  {}",
        serde_json::to_string(&envelope)?
    );
    let total: Value = json!(calls.load(Ordering::SeqCst));
    println!("\nthe tool was called {total} times; every call ended with a clear outcome.");
    Ok(())
}
