//! JSON Schema validation of tool payloads.
//!
//! Each tool may have a schema for its arguments. Schemas are compiled once, when the
//! [`Schemas`] set is built (a schema that does not compile is a configuration error
//! listing every bad schema), and checked on every call. An invalid payload fails with
//! `INVALID_INPUT` and the schema errors in the message; the inner service never runs.
//! `INVALID_INPUT` is never retried and never counted by a breaker.
//!
//! The messages name the path and the rule that failed but never the payload's values or
//! keys (either may be a secret): `"/amount: value is not of type \"integer\""`. A key
//! the schema names (in `properties`, `required`, dependencies) is shown in a path; any
//! other key is shown as `*`, and the keys a rule rejects (`additionalProperties`,
//! `propertyNames`, `unevaluatedProperties`) are counted, not listed. Checking an invalid
//! payload stops after the errors the message lists: a large payload (more than
//! 10,000 values) is reported with its first error only.
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

use std::collections::HashSet;

use jsonschema::error::ValidationErrorKind;
use jsonschema::{ValidationError, Validator};
use pin_project_lite::pin_project;
use serde_json::Value;
use toolshield_core::config::Problems;
use toolshield_core::hash::{FastHashMap, FastState};
use toolshield_core::{ConfigError, ToolError, ToolRequest};
use tower_layer::Layer;
use tower_service::Service;

/// How many schema errors a message lists before it says "and N more".
const MAX_LISTED: usize = 5;

/// Payloads with more values than this are reported with their first error only:
/// collecting every error walks the whole payload, and jsonschema collects them all
/// before handing out the first.
const MAX_NODES_FOR_ALL_ERRORS: usize = 10_000;

/// A compiled schema and the property names it declares (shown unmasked in paths).
struct Compiled {
    validator: Validator,
    names: HashSet<Box<str>, FastState>,
}

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
    by_tool: Arc<FastHashMap<Arc<str>, Compiled>>,
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
        let Some(compiled) = self.by_tool.get(tool) else {
            return match self.unknown {
                Unknown::Allow => Ok(()),
                Unknown::Reject => Err(ToolError::invalid_input(format!(
                    "no schema for tool `{tool}`"
                ))),
            };
        };
        let validator = &compiled.validator;
        if validator.is_valid(payload) {
            return Ok(());
        }
        let describe = |e: &ValidationError<'_>| describe(e, payload, &compiled.names);
        let mut message = format!("arguments for `{tool}` do not match its schema: ");
        if has_more_nodes_than(payload, MAX_NODES_FOR_ALL_ERRORS) {
            // `validate` stops at the first error; `iter_errors` would walk everything.
            let first = validator
                .validate(payload)
                .err()
                .map_or_else(|| "invalid".to_owned(), |e| describe(&e));
            message.push_str(&first);
            message.push_str("; further errors not checked");
        } else {
            let mut total = 0usize;
            let mut listed = Vec::with_capacity(MAX_LISTED);
            for error in validator.iter_errors(payload) {
                total += 1;
                if listed.len() < MAX_LISTED {
                    listed.push(describe(&error));
                }
            }
            message.push_str(&listed.join("; "));
            if total > listed.len() {
                message.push_str(&format!("; and {} more", total - listed.len()));
            }
        }
        Err(ToolError::invalid_input(message))
    }
}

/// One schema error as `path: rule`, without the payload's values, and without its keys
/// except those the schema declares.
fn describe(
    error: &ValidationError<'_>,
    payload: &Value,
    names: &HashSet<Box<str>, FastState>,
) -> String {
    let path = masked_path(error.instance_path().as_str(), payload, names);
    let rule = match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected } => format!(
            "additional properties are not allowed ({} unexpected)",
            unexpected.len()
        ),
        ValidationErrorKind::UnevaluatedProperties { unexpected } => format!(
            "unevaluated properties are not allowed ({} unexpected)",
            unexpected.len()
        ),
        ValidationErrorKind::PropertyNames { error } => format!(
            "a property name does not match `propertyNames`: {}",
            error.masked_with("the name")
        ),
        // Schema keywords whose message names no payload key: values are masked.
        _ => error.masked().to_string(),
    };
    format!("{path}: {rule}")
}

/// The JSON pointer `pointer` into `payload` with every object key the schema does not
/// declare replaced by `*` (array indices are kept).
fn masked_path(pointer: &str, payload: &Value, names: &HashSet<Box<str>, FastState>) -> String {
    if pointer.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(pointer.len());
    let mut node = Some(payload);
    for raw in pointer.split('/').skip(1) {
        out.push('/');
        node = match node {
            Some(Value::Array(items)) => {
                out.push_str(raw);
                raw.parse::<usize>().ok().and_then(|i| items.get(i))
            }
            Some(Value::Object(map)) => {
                let key = raw.replace("~1", "/").replace("~0", "~");
                if names.contains(key.as_str()) {
                    out.push_str(raw);
                } else {
                    out.push('*');
                }
                map.get(&key)
            }
            _ => {
                out.push('*');
                None
            }
        };
    }
    out
}

/// Every property name `schema` declares anywhere: keys of `properties`,
/// `dependentRequired`, `dependentSchemas` and `dependencies`, and names in `required`.
fn declared_names(schema: &Value, names: &mut HashSet<Box<str>, FastState>) {
    let mut stack = vec![schema];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                for (keyword, sub) in map {
                    match (keyword.as_str(), sub) {
                        (
                            "properties" | "dependentRequired" | "dependentSchemas"
                            | "dependencies",
                            Value::Object(props),
                        ) => names.extend(props.keys().map(|k| Box::from(k.as_str()))),
                        ("required", Value::Array(required)) => {
                            names.extend(required.iter().filter_map(Value::as_str).map(Box::from))
                        }
                        _ => {}
                    }
                    stack.push(sub);
                }
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
}

/// Whether `payload` holds more than `limit` values (stops counting past it).
fn has_more_nodes_than(payload: &Value, limit: usize) -> bool {
    let mut seen = 0usize;
    let mut stack = vec![payload];
    while let Some(value) = stack.pop() {
        seen += 1;
        if seen > limit {
            return true;
        }
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    false
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
                    let mut names = HashSet::default();
                    declared_names(&schema, &mut names);
                    by_tool.insert(tool, Compiled { validator, names });
                }
                Err(e) => {
                    // Where in the schema: the instance of a compile error is the schema.
                    let at = e.instance_path().as_str();
                    let at = if at.is_empty() { "/" } else { at };
                    problems.push(
                        field,
                        format_args!("invalid schema at {at}: {}", e.masked()),
                    );
                }
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
