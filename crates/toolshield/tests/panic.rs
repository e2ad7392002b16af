//! A tool that panics: caught inside the stack, `INTERNAL` for the caller, counted by the
//! breaker, never retried, and its text kept out of everything the caller and the model see.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield::shield::{RouterBuilder, Shield, ToolRouter};
use toolshield_core::panic::is_panic;
use toolshield_core::{
    CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolResult, ToolStatus,
};
use tower::{service_fn, ServiceExt};

const SECRET: &str = "token sk-live-42: missing argument `city`";

/// A tool that counts its calls and panics in its future (an `unwrap` on a missing
/// argument).
fn panicking_tool(calls: &Arc<AtomicUsize>) -> impl toolshield_core::ToolService {
    let calls = Arc::clone(calls);
    service_fn(move |req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let city = req.payload().get("city").and_then(|c| c.as_str());
            let city = city.expect(SECRET);
            Ok::<_, ToolError>(ToolResponse::new(json!({ "city": city })))
        }
    })
}

fn shield(toml: &str) -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(toml).expect("config")).expect("shield")
}

fn req() -> ToolRequest {
    ToolRequest::new("weather", json!({"units": "metric"})).kind(CallKind::ReadOnly)
}

async fn call(router: &ToolRouter) -> Result<ToolResponse, ToolError> {
    router.clone().oneshot(req()).await
}

fn assert_internal_without_the_text(result: Result<ToolResponse, ToolError>) {
    let err = result.as_ref().expect_err("a panic is an error");
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(is_panic(err), "marked as a panic: {err:?}");
    let for_model = err.for_model("weather");
    let envelope = ToolResult::from(result);
    assert_eq!(envelope.status, ToolStatus::Error);
    let e = envelope.error.as_ref().expect("an error in the envelope");
    assert_eq!(e.code, "INTERNAL");
    assert!(!e.retriable);
    let seen = format!(
        "{} {} {}",
        e.message,
        for_model,
        serde_json::to_string(&envelope).expect("json")
    );
    assert!(
        !seen.contains("sk-live") && !seen.contains("city"),
        "the panic text never reaches the caller or the model: {seen}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_tool_through_the_router_is_internal_without_its_text() {
    let calls = Arc::new(AtomicUsize::new(0));
    let router = shield("[tools.weather]\nkind = \"read_only\"\n")
        .router()
        .tool("weather", panicking_tool(&calls))
        .build()
        .expect("valid tool names");
    assert_internal_without_the_text(call(&router).await);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_panic_counts_for_the_breaker_and_is_not_retried() {
    let calls = Arc::new(AtomicUsize::new(0));
    let shield = shield(
        r#"
        [defaults.retry]
        max_attempts = 3
        [defaults.breaker]
        consecutive_failures = 2
        [tools.weather]
        kind = "read_only"
        "#,
    );
    let router = shield
        .router()
        .tool("weather", panicking_tool(&calls))
        .build()
        .expect("valid tool names");

    assert_internal_without_the_text(call(&router).await);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "INTERNAL is not retried, though 3 attempts are allowed"
    );
    assert_internal_without_the_text(call(&router).await);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let third = call(&router)
        .await
        .expect_err("two panics in a row open the breaker");
    assert_eq!(third.kind(), ErrorKind::CircuitOpen);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "an open breaker fails fast"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_call_is_caught_by_the_stack() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    // Panics in `call` itself, before any future exists.
    let tool = service_fn(move |req: ToolRequest| {
        c.fetch_add(1, Ordering::SeqCst);
        if req.payload().get("city").is_none() {
            panic!("{SECRET}");
        }
        async { Ok::<_, ToolError>(ToolResponse::new(json!({}))) }
    });
    let router = shield("[tools.weather]\nkind = \"read_only\"\n")
        .router()
        .tool("weather", tool)
        .build()
        .expect("valid tool names");
    assert_internal_without_the_text(call(&router).await);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn every_route_contains_panics_shielded_or_not() {
    let calls = Arc::new(AtomicUsize::new(0));
    let unshielded = RouterBuilder::unshielded()
        .tool("weather", panicking_tool(&calls))
        .build()
        .expect("valid tool names");
    assert_internal_without_the_text(call(&unshielded).await);

    // A disabled shield is a pass-through, and still no panic leaves the router.
    let disabled = shield("enabled = false\n[tools.weather]\nkind = \"read_only\"\n")
        .router()
        .tool("weather", panicking_tool(&calls))
        .build()
        .expect("valid tool names");
    assert_internal_without_the_text(call(&disabled).await);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
