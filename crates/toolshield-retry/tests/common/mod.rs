//! A scripted tool for the retry tests: answers from a list, records every call.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::future::{ready, Ready};
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::service_fn;
use tower::util::ServiceFn;

/// One call the tool saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub attempt: u32,
    pub execution_id: String,
    pub attempt_token: CancellationToken,
}

/// A tool that answers from `script` (then succeeds) and records each call.
#[derive(Clone, Default)]
pub struct Script {
    outcomes: Arc<Mutex<VecDeque<Result<ToolResponse, ToolError>>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Script {
    pub fn new(outcomes: impl IntoIterator<Item = Result<ToolResponse, ToolError>>) -> Self {
        Script {
            outcomes: Arc::new(Mutex::new(outcomes.into_iter().collect())),
            seen: Arc::default(),
        }
    }

    /// Always fails with `kind`.
    pub fn always(kind: ErrorKind) -> Self {
        Script::new((0..10_000).map(move |_| Err(ToolError::new(kind, "scripted failure"))))
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// The tool as a clonable tower service.
    pub fn service(
        &self,
    ) -> ServiceFn<impl Fn(ToolRequest) -> Ready<Result<ToolResponse, ToolError>> + Clone> {
        let this = self.clone();
        service_fn(move |req: ToolRequest| {
            this.seen.lock().unwrap().push(Seen {
                at: Instant::now(),
                attempt: req.attempt(),
                execution_id: req.execution_id().to_string(),
                attempt_token: req.attempt_token().clone(),
            });
            let out = this
                .outcomes
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| Ok(ToolResponse::new(json!({"ok": true}))));
            ready(out)
        })
    }
}

pub fn err(kind: ErrorKind) -> Result<ToolResponse, ToolError> {
    Err(ToolError::new(kind, "scripted failure"))
}

pub fn ok() -> Result<ToolResponse, ToolError> {
    Ok(ToolResponse::new(json!({"temp": 21})))
}

pub fn read_request() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly)
}

/// Gaps between consecutive calls.
pub fn gaps(seen: &[Seen]) -> Vec<std::time::Duration> {
    seen.windows(2).map(|w| w[1].at - w[0].at).collect()
}
