//! Shared helpers of the Redis integration tests.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{
    IdempotencyConfig, IdempotencyHandle, IdempotencyLayer, IdempotencyStore, OnStoreError,
};
use toolshield_redis::testing::unique_prefix;
use toolshield_redis::{RedisConfig, RedisConnection};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

/// A stack as one process would build it.
pub type Stack = BoxCloneService<ToolRequest, ToolResponse, ToolError>;

/// Connects a fresh client (its own connection, as a separate process would have).
pub async fn connect(url: &str, prefix: &str, op_timeout: Duration) -> RedisConnection {
    let config = RedisConfig::from_url(url)
        .with_key_prefix(prefix)
        .with_op_timeout(op_timeout);
    match RedisConnection::connect(config).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to the test redis: {e}"),
    }
}

/// A fresh prefix for one test.
pub fn prefix() -> String {
    unique_prefix()
}

/// A tool that counts its executions, takes `work` to run, and answers with the number
/// of the execution that produced the result and `who` ran it.
pub fn counting_tool(
    runs: Arc<AtomicUsize>,
    who: &'static str,
    work: Duration,
) -> impl tower::Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future = impl Send>
       + Clone
       + Send
       + 'static {
    service_fn(move |_req: ToolRequest| {
        let runs = Arc::clone(&runs);
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            Ok::<_, ToolError>(ToolResponse::new(json!({"execution": n, "by": who})))
        }
    })
}

/// An idempotency stack over `store` around `tool`.
pub fn stack<T>(
    config: IdempotencyConfig,
    store: Arc<dyn IdempotencyStore>,
    tool: T,
) -> (Stack, IdempotencyHandle)
where
    T: tower::Service<ToolRequest, Response = ToolResponse, Error = ToolError>
        + Clone
        + Send
        + 'static,
    T::Future: Send + 'static,
{
    let layer = match IdempotencyLayer::with_store(config, store) {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    };
    let handle = layer.handle();
    (BoxCloneService::new(layer.layer(tool)), handle)
}

/// A mutating call of `pay` with idempotency key `key`.
pub fn pay(key: &str) -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": 42, "currency": "EUR"}))
        .kind(CallKind::Mutating)
        .idempotency_key(key)
}

/// One call through `stack`.
pub fn call(stack: &Stack, req: ToolRequest) -> tower::util::Oneshot<Stack, ToolRequest> {
    stack.clone().oneshot(req)
}

/// The idempotency settings of the fault tests: a 2 s lease.
pub fn config(on_store_error: OnStoreError) -> IdempotencyConfig {
    IdempotencyConfig {
        on_store_error,
        lease: Duration::from_secs(2),
        ..IdempotencyConfig::default()
    }
}

/// Polls `f` until it returns `Some`, for at most `within`.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
