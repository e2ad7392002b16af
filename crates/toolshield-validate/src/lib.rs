//! JSON Schema validation of tool payloads.
//!
//! Each tool may have a schema for its arguments. Schemas are compiled once, when the
//! [`Schemas`] set is built (a schema that does not compile is a configuration error
//! listing every bad schema), and checked on every call. An invalid payload fails with
//! `INVALID_INPUT` and the schema errors in the message; the inner service never runs.
//! `INVALID_INPUT` is never retried and never counted by a breaker.
//!
//! The messages name the path and the rule that failed but never the payload's values
//! (they may be secrets): `"/amount: value is not of type \"integer\""`.
//!
//! In the default stack it sits inside the deadline and before cache, idempotency and
//! breaker, so a malformed call claims no key, fills no cache and never counts against
//! the tool:
//!
//! ```text
//! metrics > provenance > cancel > deadline > VALIDATE > cache > idempotency > fallback
//!         > retry > breaker > attempt timeout > tool
//! ```
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//! use tower::{service_fn, Layer, ServiceExt};
//! use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
//! use toolshield_validate::{Schemas, ValidateLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let schemas = Schemas::builder()
//!     .tool("pay", json!({
//!         "type": "object",
//!         "properties": {"amount": {"type": "integer", "minimum": 1}},
//!         "required": ["amount"]
//!     }))
//!     .build()
//!     .unwrap();
//! let tool = service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!("paid"))) });
//! let svc = ValidateLayer::new(schemas).layer(tool);
//!
//! let err = svc.clone().oneshot(ToolRequest::new("pay", json!({"amount": "ten"}))).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::InvalidInput);
//! assert!(svc.oneshot(ToolRequest::new("pay", json!({"amount": 10}))).await.is_ok());
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use jsonschema::Validator;
use pin_project_lite::pin_project;
use serde_json::Value;
use toolshield_core::config::Problems;
use toolshield_core::hash::{FastHashMap, FastState};
use toolshield_core::{ConfigError, ToolError, ToolRequest};
use tower_layer::Layer;
use tower_service::Service;

/// How many schema errors a message lists before it says "and N more".
const MAX_LISTED: usize = 5;

/// What to do with a tool that has no schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unknown {
    /// Let the call through unchecked (the default).
    #[default]
    Allow,
    /// Reject it with `INVALID_INPUT`: every tool must have a schema.
    Reject,
}

/// Compiled schemas, one per tool. Cheap to clone.
#[derive(Clone)]
pub struct Schemas {
    by_tool: Arc<FastHashMap<Arc<str>, Validator>>,
    unknown: Unknown,
}

impl fmt::Debug for Schemas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tools: Vec<_> = self.by_tool.keys().collect();
        tools.sort();
        f.debug_struct("Schemas")
            .field("tools", &tools)
            .field("unknown", &self.unknown)
            .finish()
    }
}

impl Schemas {
    /// Starts a set of schemas.
    pub fn builder() -> SchemasBuilder {
        SchemasBuilder::default()
    }

    /// Whether `tool` has a schema.
    pub fn contains(&self, tool: &str) -> bool {
        self.by_tool.contains_key(tool)
    }

    /// Checks `payload` against the schema of `tool`.
    ///
    /// `Ok` when it is valid or the tool has no schema (and unknown tools are allowed);
    /// otherwise `INVALID_INPUT` listing what failed, without the payload's values.
    pub fn check(&self, tool: &str, payload: &Value) -> Result<(), ToolError> {
        let Some(validator) = self.by_tool.get(tool) else {
            return match self.unknown {
                Unknown::Allow => Ok(()),
                Unknown::Reject => Err(ToolError::invalid_input(format!(
                    "no schema for tool `{tool}`"
                ))),
            };
        };
        if validator.is_valid(payload) {
            return Ok(());
        }
        let mut listed = Vec::with_capacity(MAX_LISTED);
        let mut total = 0usize;
        for error in validator.iter_errors(payload) {
            total += 1;
            if listed.len() < MAX_LISTED {
                let path = error.instance_path().to_string();
                let path = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                listed.push(format!("{path}: {}", error.masked()));
            }
        }
        let mut message = format!(
            "arguments for `{tool}` do not match its schema: {}",
            listed.join("; ")
        );
        if total > listed.len() {
            message.push_str(&format!("; and {} more", total - listed.len()));
        }
        Err(ToolError::invalid_input(message))
    }
}

/// Builds [`Schemas`]; compiling happens in [`build`](SchemasBuilder::build).
#[derive(Debug, Default)]
pub struct SchemasBuilder {
    schemas: Vec<(Arc<str>, Value)>,
    unknown: Unknown,
}

impl SchemasBuilder {
    /// Adds the schema of `tool`'s arguments.
    pub fn tool(mut self, tool: impl Into<Arc<str>>, schema: Value) -> Self {
        self.schemas.push((tool.into(), schema));
        self
    }

    /// What to do with a tool that has no schema (default [`Unknown::Allow`]).
    pub fn unknown_tools(mut self, unknown: Unknown) -> Self {
        self.unknown = unknown;
        self
    }

    /// Compiles every schema; fails listing every schema that does not compile and every
    /// tool given twice.
    pub fn build(self) -> Result<Schemas, ConfigError> {
        let mut problems = Problems::new();
        let mut by_tool =
            FastHashMap::with_capacity_and_hasher(self.schemas.len(), FastState::default());
        for (tool, schema) in self.schemas {
            let field = format!("tools.{tool}.schema");
            if by_tool.contains_key(&tool) {
                problems.push(field, "schema given twice");
                continue;
            }
            match jsonschema::validator_for(&schema) {
                Ok(validator) => {
                    by_tool.insert(tool, validator);
                }
                Err(e) => problems.push(field, format_args!("invalid schema: {}", e.masked())),
            }
        }
        problems.into_result()?;
        Ok(Schemas {
            by_tool: Arc::new(by_tool),
            unknown: self.unknown,
        })
    }
}

/// Applies [`Validate`] with a set of schemas.
#[derive(Debug, Clone)]
pub struct ValidateLayer {
    schemas: Schemas,
}

impl ValidateLayer {
    /// Validates payloads against `schemas`.
    pub fn new(schemas: Schemas) -> Self {
        ValidateLayer { schemas }
    }
}

impl<S> Layer<S> for ValidateLayer {
    type Service = Validate<S>;

    fn layer(&self, inner: S) -> Validate<S> {
        Validate {
            inner,
            schemas: self.schemas.clone(),
        }
    }
}

/// Rejects a payload that does not match its tool's schema with `INVALID_INPUT`; the
/// inner service never sees it.
#[derive(Debug, Clone)]
pub struct Validate<S> {
    inner: S,
    schemas: Schemas,
}

impl<S> Validate<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<ToolRequest> for Validate<S>
where
    S: Service<ToolRequest>,
    S::Error: Into<ToolError>,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        match self.schemas.check(req.settings_name(), req.payload()) {
            Ok(()) => ResponseFuture {
                state: State::Inner {
                    inner: self.inner.call(req),
                },
            },
            Err(error) => ResponseFuture {
                state: State::Invalid { error: Some(error) },
            },
        }
    }
}

pin_project! {
    /// The future of [`Validate`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner { #[pin] inner: F },
        Invalid { error: Option<ToolError> },
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, Res, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<ToolError>,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { inner } => inner.poll(cx).map_err(Into::into),
            StateProj::Invalid { error } => Poll::Ready(Err(error.take().unwrap_or_else(|| {
                ToolError::internal("validate future polled after completion")
            }))),
        }
    }
}
