#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

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
use toolshield_core::hash::FastState;
use toolshield_core::IntoToolError;
use toolshield_core::{printable, ConfigError, ToolError, ToolRequest, MAX_TOOL_NAME_SHOWN};
use tower_layer::Layer;
use tower_service::Service;

/// How many schema errors a message lists before it says "and N more".
const MAX_LISTED: usize = 5;

/// At most this many bytes of one listed error (its path and rule): a rule quotes what
/// the schema holds (a `const`, a `pattern`), which a schema from a remote server may
/// make as long as it likes.
const MAX_ERROR_SHOWN: usize = 256;

/// How many problems of a schema that does not compile are listed before the rest is
/// counted.
const MAX_SCHEMA_PROBLEMS: usize = 20;

/// Payloads with more values than this are reported with their first error only:
/// collecting every error walks the whole payload, and jsonschema collects them all
/// before handing out the first.
const MAX_NODES_FOR_ALL_ERRORS: usize = 10_000;

/// How deeply arrays and objects may nest in a schema or a payload: the depth
/// serde_json's parser allows. Compiling and validating recurse once per level, so a
/// deeper value (built in code; a parsed one cannot be) could exhaust the stack.
pub const MAX_DEPTH: usize = 128;

/// The most backtracking steps one `pattern` may take on one string. A schema may come
/// from a remote server: a pattern with lookaround or backreferences (the only ones the
/// backtracking engine runs; the others run in linear time) that backtracks
/// catastrophically fails that string after this many steps instead of holding the call.
const BACKTRACK_LIMIT: usize = 10_000;

/// Whether arrays and objects nest in `value` deeper than `levels` (recursing at most
/// that many levels, with no allocation).
fn deeper_than(value: &Value, levels: usize) -> bool {
    let rest = match value {
        Value::Array(_) | Value::Object(_) => match levels.checked_sub(1) {
            Some(rest) => rest,
            None => return true,
        },
        _ => return false,
    };
    match value {
        Value::Array(items) => items.iter().any(|child| deeper_than(child, rest)),
        Value::Object(map) => map.values().any(|child| deeper_than(child, rest)),
        _ => false,
    }
}

/// Drops `value` level by level: dropping a `Value` recurses once per level, which a
/// value too deep to check must not do either.
fn drop_flat(value: Value) {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// A compiled schema and the property names it declares (shown unmasked in paths).
struct Compiled {
    validator: Validator,
    names: HashSet<Box<str>, FastState>,
}

/// One compiled schema of a tool's arguments. Cheap to clone.
#[derive(Clone)]
pub struct Schema {
    compiled: Arc<Compiled>,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schema").finish_non_exhaustive()
    }
}

impl Schema {
    /// Compiles `schema`. A schema that does not compile is a [`ConfigError`] saying
    /// where in the schema the problem is (its problem has an empty field: prefix it
    /// with where the schema came from, as the facade does with `tools.NAME.schema`).
    ///
    /// The schema may come from an untrusted server: no `$ref` is ever fetched (a remote
    /// one is a `ConfigError`), one nested deeper than [`MAX_DEPTH`] is refused, and a
    /// `pattern` is cut short when it backtracks catastrophically.
    pub fn new(schema: Value) -> Result<Schema, ConfigError> {
        if deeper_than(&schema, MAX_DEPTH) {
            drop_flat(schema);
            return Err(ConfigError::single(
                "",
                format_args!("invalid schema: nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        // Offline whatever resolvers jsonschema was built with: another crate in the
        // build taking jsonschema with its default features turns on its file and HTTP
        // resolvers here too (features unify).
        let options = jsonschema::options().offline().with_pattern_options(
            jsonschema::PatternOptions::fancy_regex().backtrack_limit(BACKTRACK_LIMIT),
        );
        match options.build(&schema) {
            Ok(validator) => {
                let mut names = HashSet::default();
                declared_names(&schema, &mut names);
                Ok(Schema {
                    compiled: Arc::new(Compiled { validator, names }),
                })
            }
            Err(e) => Err(schema_problems(&schema, &e)),
        }
    }

    /// Checks `payload`, the arguments of a call of `tool` (named in the message).
    ///
    /// `Ok` when it is valid; otherwise `INVALID_INPUT` listing what failed, without the
    /// payload's values. A payload nested deeper than [`MAX_DEPTH`] is `INVALID_INPUT`
    /// without being checked.
    pub fn check(&self, tool: &str, payload: &Value) -> Result<(), ToolError> {
        // The tool name may come from a remote server: on one line, bounded.
        let tool = printable(tool, MAX_TOOL_NAME_SHOWN);
        if deeper_than(payload, MAX_DEPTH) {
            return Err(ToolError::invalid_input(format!(
                "arguments for `{tool}` nest arrays and objects deeper than {MAX_DEPTH} levels"
            )));
        }
        let compiled = &*self.compiled;
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

/// Every problem of a schema that did not compile (`build` is the error the build
/// stopped at): each place where it breaks its meta-schema, and the build's own error
/// when that is not one of them (a reference that goes nowhere, a pattern that is not a
/// regex). At most [`MAX_SCHEMA_PROBLEMS`] are listed, the rest counted.
fn schema_problems(schema: &Value, build: &ValidationError<'_>) -> ConfigError {
    // Where in the schema: the instance of a compile error is the schema.
    let problem = |e: &ValidationError<'_>| {
        let at = e.instance_path().as_str();
        let at = if at.is_empty() { "/" } else { at };
        let text = format!("invalid schema at {at}: {}", e.masked());
        printable(&text, MAX_ERROR_SHOWN).into_owned()
    };
    let first = problem(build);
    let mut problems = Problems::new();
    let mut listed = 0usize;
    let mut unlisted = 0usize;
    let mut first_seen = false;
    // Only a schema of a draft jsonschema bundles is checked against its meta-schema: a
    // `$schema` of another would have its meta-schema fetched.
    if jsonschema::Draft::default().detect(schema) != jsonschema::Draft::Unknown {
        if let Ok(meta) = jsonschema::meta::validator_for(schema) {
            for error in meta.iter_errors(schema) {
                let text = problem(&error);
                first_seen |= text == first;
                if listed == MAX_SCHEMA_PROBLEMS {
                    unlisted += 1;
                } else {
                    problems.push("", text);
                    listed += 1;
                }
            }
        }
    }
    if !first_seen {
        if listed < MAX_SCHEMA_PROBLEMS {
            problems.push("", first);
        } else {
            unlisted += 1;
        }
    }
    if unlisted > 0 {
        problems.push(
            "",
            format_args!("invalid schema: and {unlisted} more problems"),
        );
    }
    problems
        .into_result()
        .err()
        .unwrap_or_else(|| ConfigError::single("", "invalid schema"))
}

/// One schema error as `path: rule`, without the payload's values, and without its keys
/// except those the schema declares; on one line and at most [`MAX_ERROR_SHOWN`] bytes.
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
    let text = format!("{path}: {rule}");
    match printable(&text, MAX_ERROR_SHOWN) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(cut) => cut,
    }
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

/// Applies [`Validate`] with the schema of one tool.
#[derive(Debug, Clone)]
pub struct ValidateLayer {
    schema: Schema,
}

impl ValidateLayer {
    /// Validates payloads against `schema`.
    pub fn new(schema: Schema) -> Self {
        ValidateLayer { schema }
    }
}

impl<S> Layer<S> for ValidateLayer {
    type Service = Validate<S>;

    fn layer(&self, inner: S) -> Validate<S> {
        Validate {
            inner,
            schema: self.schema.clone(),
        }
    }
}

/// Rejects a payload that does not match its tool's schema with `INVALID_INPUT`; the
/// inner service never sees it.
#[derive(Debug, Clone)]
pub struct Validate<S> {
    inner: S,
    schema: Schema,
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
    S::Error: IntoToolError,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner
            .poll_ready(cx)
            .map_err(IntoToolError::into_tool_error)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        match self.schema.check(req.tool(), req.payload()) {
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
    E: IntoToolError,
{
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { inner } => inner.poll(cx).map_err(IntoToolError::into_tool_error),
            StateProj::Invalid { error } => Poll::Ready(Err(error.take().unwrap_or_else(|| {
                ToolError::internal("validate future polled after completion")
            }))),
        }
    }
}
