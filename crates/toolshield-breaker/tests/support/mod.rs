//! The breaker tests' tool, whose behaviour the payload field `r` chooses, and the stack
//! around it.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry};
use toolshield_core::{ErrorKind, ShieldResponse, SlowCall, ToolError, ToolRequest, ToolResponse};
use tower::{Layer, Service, ServiceExt};

pub type BoxFut = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

/// A tool whose behaviour is chosen by the payload field `r`; counts its calls and the
/// probes it sees.
#[derive(Clone, Default)]
pub struct Tool {
    pub calls: Arc<AtomicUsize>,
    pub probes: Arc<AtomicUsize>,
}

impl Service<ToolRequest> for Tool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = BoxFut;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> BoxFut {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if req.state().is_probe() {
            self.probes.fetch_add(1, Ordering::SeqCst);
        }
        let r = req.payload()["r"].as_str().unwrap_or("ok").to_owned();
        Box::pin(async move {
            match r.as_str() {
                "ok" => Ok(ToolResponse::new(json!({"ok": true}))),
                "slow" => {
                    let mut res = ToolResponse::new(json!({"ok": true}));
                    res.mark_slow(SlowCall {
                        elapsed: Duration::from_secs(3),
                        threshold: Duration::from_secs(2),
                    });
                    Ok(res)
                }
                "sleep" => {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Ok(ToolResponse::new(json!({"ok": true})))
                }
                "sleep_fail" => {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
                }
                "hang" => std::future::pending().await,
                "panic" => panic!("the tool broke"),
                "fail" => Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down")),
                "timeout" => Err(ToolError::timeout("too slow")),
                "rate_limited" => Err(ToolError::rate_limited("429", None)),
                "unauthorized" => Err(ToolError::new(ErrorKind::Unauthorized, "401")),
                "is_error" => Ok(ToolResponse::new(json!({"isError": true}))),
                "invalid" => Err(ToolError::invalid_input("bad args")),
                "not_found" => Err(ToolError::new(ErrorKind::NotFound, "404")),
                "cancel" => Err(ToolError::cancelled("caller left")),
                other => Err(ToolError::internal(format!("unknown step {other}"))),
            }
        })
    }
}

pub fn req(key: &str, r: &str) -> ToolRequest {
    ToolRequest::new(key, json!({ "r": r }))
}

pub type Svc = toolshield_breaker::Breaker<Tool>;

pub fn setup(config: BreakerConfig) -> (Svc, BreakerRegistry, Tool) {
    let layer = BreakerLayer::from_config(&config).expect("valid config");
    let tool = Tool::default();
    let registry = layer.registry().clone();
    (layer.layer(tool.clone()), registry, tool)
}

pub async fn call(svc: &mut Svc, key: &str, r: &str) -> Result<ToolResponse, ToolError> {
    svc.ready().await?.call(req(key, r)).await
}

pub async fn calls(svc: &mut Svc, key: &str, r: &str, n: usize) {
    for _ in 0..n {
        let _ = call(svc, key, r).await;
    }
}
