//! The size of the default stack's call future, the bytes each call moves through the
//! layers: kept in check so that a layer added to the stack does not silently grow it.

use std::mem::size_of_val;

use serde_json::json;
use toolshield::prelude::*;
use toolshield_test::BareTool;
use tower::Service;

const CONFIG: &str = r#"
[tools.weather]
kind = "read_only"
cache = { ttl = "10m" }

[tools.quote]
kind = "read_only"
"#;

/// The default stack's call future for a read-only tool without cache or fallback.
const STACK_FUTURE_AT_MOST: usize = 1024;

#[tokio::test]
async fn the_stack_future_stays_small() {
    let shield =
        Shield::from_config(ShieldConfig::from_toml_str(CONFIG).expect("config")).expect("shield");
    let mut bare = BareTool;
    let bare_size = size_of_val(&bare.call(ToolRequest::new("quote", json!({}))));
    let mut svc = shield.wrap("quote", BareTool);
    let fut = svc.call(ToolRequest::new("quote", json!({})).kind(CallKind::ReadOnly));
    let stack_size = size_of_val(&fut);
    drop(fut);
    let request = std::mem::size_of::<ToolRequest>();
    let result = std::mem::size_of::<Result<ToolResponse, ToolError>>();
    let service = size_of_val(&svc);
    println!("future sizes: bare {bare_size} B, default stack {stack_size} B; the stack service {service} B; ToolRequest {request} B, Result {result} B");
    // 800 bytes today in a debug build (a tool without cache or fallback): a layer that
    // grows the future by more than a few words shows here.
    assert!(
        stack_size <= STACK_FUTURE_AT_MOST,
        "the stack's future is {stack_size} bytes, at most {STACK_FUTURE_AT_MOST} expected"
    );
    assert!(
        request <= 128,
        "a ToolRequest is {request} bytes, at most 128 expected"
    );
    // Every layer moves the result at least once: 56 bytes today (the provenance record
    // and the error's details are boxed), 232 with the record inline.
    assert!(
        result <= 64,
        "the Result is {result} bytes, at most 64 expected"
    );
}
