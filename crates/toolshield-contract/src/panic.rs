//! Panics stop here: [`CatchPanicLayer`] turns a panic of the service it wraps into an
//! `INTERNAL` [`ToolError`].
//!
//! A tool that panics (an `unwrap()` on a missing argument) would otherwise unwind
//! through every layer and out of the caller's task. [`CatchPanic`] catches a panic in
//! the inner service's `call`, in its future's `poll` and in its `poll_ready`, and answers
//! with an `INTERNAL` error whose message is generic ("the tool panicked"): the panic text
//! may hold arguments, secrets or upstream details, so it never reaches
//! [`ToolError::message`] or [`ToolError::for_model`]. It is handed to an optional hook
//! ([`CatchPanicLayer::on_panic`]) that logs it; the facade logs it with `tracing`.
//!
//! The error's [source](std::error::Error::source) is a [`Panicked`], so the layers around
//! can tell a caught panic from toolshield's own `INTERNAL` defects ([`is_panic`]).
//! [`CountPanics`] is a classifier that counts a caught panic as a breaker failure
//! (never retriable); the default stack's breaker uses it.
//!
//! The process's panic hook still runs when the panic happens (by default it prints the
//! text to stderr; replace it with [`std::panic::set_hook`]). Under `panic = "abort"`
//! nothing can be caught.
//!
//! ```
//! use std::future::poll_fn;
//! use toolshield_contract::panic::{is_panic, CatchPanicLayer};
//! use toolshield_contract::{ErrorKind, ToolError};
//! use tower_service::Service;
//!
//! #[derive(Clone)]
//! struct Tool;
//! impl Service<Option<u32>> for Tool {
//!     type Response = u32;
//!     type Error = ToolError;
//!     type Future = std::future::Ready<Result<u32, ToolError>>;
//!     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), ToolError>> {
//!         std::task::Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, arg: Option<u32>) -> Self::Future {
//!         std::future::ready(Ok(arg.expect("the argument `city` is missing") + 1))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # std::panic::set_hook(Box::new(|_| {}));
//! let mut svc = CatchPanicLayer::new()
//!     .on_panic(|text: &str| eprintln!("a tool panicked: {text}"))
//!     .layer(Tool);
//! poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
//! let err = svc.call(None).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Internal);
//! assert!(is_panic(&err));
//! assert!(!err.message().contains("city"), "the panic text stays out of the error");
//! # }
//! ```

use std::any::Any;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{Classify, DefaultClassifier, ErrorKind, Failure, Outcome, ToolError};

/// The message of every error made from a caught panic.
const MESSAGE: &str = "the tool panicked";

/// The source of the `INTERNAL` error a caught panic becomes: it marks the error as a
/// panic ([`is_panic`]). It carries no panic text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Panicked;

impl Panicked {
    /// The error a caught panic becomes: `INTERNAL`, "the tool panicked", with a
    /// [`Panicked`] source.
    pub fn error() -> ToolError {
        ToolError::internal(MESSAGE).with_source(Panicked)
    }
}

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MESSAGE)
    }
}

impl StdError for Panicked {}

/// Whether `error` is a caught panic ([`Panicked::error`]).
pub fn is_panic(error: &ToolError) -> bool {
    error.kind() == ErrorKind::Internal
        && StdError::source(error).is_some_and(|s| s.is::<Panicked>())
}

/// What to do with the text of a caught panic (its `&str` or `String` payload; other
/// payloads are described as such): log it. Implemented by [`IgnorePanicText`] and by any
/// `Fn(&str) + Clone`. A hook that panics itself is contained too.
pub trait OnPanic: Clone {
    /// Called once per caught panic, with its text.
    fn on_panic(&self, text: &str);
}

/// The default hook: the text is dropped (the process's panic hook has already seen it).
#[derive(Debug, Clone, Copy, Default)]
pub struct IgnorePanicText;

impl OnPanic for IgnorePanicText {
    fn on_panic(&self, _text: &str) {}
}

impl<F> OnPanic for F
where
    F: Fn(&str) + Clone,
{
    fn on_panic(&self, text: &str) {
        self(text)
    }
}

/// The text of a caught panic's payload (`panic!("...")` makes a `&str` or a `String`):
/// for a log line, never for an error a caller or a model sees (it may hold anything).
pub fn payload_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic with a payload that is not a string"
    }
}

/// Hands the text of a caught panic to `hook` (containing a panic of the hook) and
/// returns the error the caller gets.
fn caught<H: OnPanic, E: From<ToolError>>(hook: &H, payload: &(dyn Any + Send)) -> E {
    report(hook, payload);
    E::from(Panicked::error())
}

/// The text only: the error is made when the future is polled.
fn report<H: OnPanic>(hook: &H, payload: &(dyn Any + Send)) {
    let text = payload_text(payload);
    let _ = catch_unwind(AssertUnwindSafe(|| hook.on_panic(text)));
}

/// Wraps a service in [`CatchPanic`]. Configuration only: the hook that sees the panic
/// text.
#[derive(Clone, Copy, Default)]
pub struct CatchPanicLayer<H = IgnorePanicText> {
    hook: H,
}

impl CatchPanicLayer {
    /// A layer whose services drop the panic text.
    #[must_use]
    pub fn new() -> Self {
        CatchPanicLayer {
            hook: IgnorePanicText,
        }
    }
}

impl<H> CatchPanicLayer<H> {
    /// Hands the text of every caught panic to `hook` (to log it). The hook is cloned into
    /// each response future: keep it cheap to clone (a function, a closure capturing
    /// nothing, an `Arc`).
    #[must_use]
    pub fn on_panic<H2: OnPanic>(self, hook: H2) -> CatchPanicLayer<H2> {
        CatchPanicLayer { hook }
    }

    /// Wraps `inner` (what [`tower_layer::Layer::layer`] does).
    pub fn layer<S>(&self, inner: S) -> CatchPanic<S, H>
    where
        H: Clone,
    {
        CatchPanic {
            inner,
            hook: self.hook.clone(),
        }
    }
}

impl<H> fmt::Debug for CatchPanicLayer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CatchPanicLayer").finish_non_exhaustive()
    }
}

impl<S, H: Clone> tower_layer::Layer<S> for CatchPanicLayer<H> {
    type Service = CatchPanic<S, H>;

    fn layer(&self, inner: S) -> Self::Service {
        CatchPanicLayer::layer(self, inner)
    }
}

/// Turns a panic of the inner service (in `poll_ready`, `call` or its future's `poll`)
/// into an `INTERNAL` error marked [`Panicked`]; see the [module docs](self).
///
/// Generic over the request type; the inner service's error must convert from
/// [`ToolError`] (`ToolError` itself, tower's `BoxError`).
#[derive(Clone)]
pub struct CatchPanic<S, H = IgnorePanicText> {
    inner: S,
    hook: H,
}

impl<S> CatchPanic<S> {
    /// Wraps `inner`; the panic text is dropped.
    #[must_use]
    pub fn new(inner: S) -> Self {
        CatchPanicLayer::new().layer(inner)
    }
}

impl<S, H> CatchPanic<S, H> {
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

impl<S: fmt::Debug, H> fmt::Debug for CatchPanic<S, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CatchPanic")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, H, R> Service<R> for CatchPanic<S, H>
where
    S: Service<R>,
    S::Error: From<ToolError>,
    H: OnPanic,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        match catch_unwind(AssertUnwindSafe(|| self.inner.poll_ready(cx))) {
            Ok(ready) => ready,
            Err(payload) => Poll::Ready(Err(caught(&self.hook, &*payload))),
        }
    }

    #[inline(always)]
    fn call(&mut self, req: R) -> Self::Future {
        let hook = self.hook.clone();
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(future) => ResponseFuture {
                kind: Kind::Running { future },
                hook,
            },
            Err(payload) => {
                // Reported now, answered on the first poll.
                report(&hook, &*payload);
                ResponseFuture {
                    kind: Kind::Panicked,
                    hook,
                }
            }
        }
    }
}

pin_project! {
    /// The future of [`CatchPanic`]: the inner future, polled inside `catch_unwind`, or
    /// the answer to a `call` that panicked.
    pub struct ResponseFuture<F, H = IgnorePanicText> {
        #[pin]
        kind: Kind<F>,
        hook: H,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Running { #[pin] future: F },
        Panicked,
    }
}

impl<F, H> fmt::Debug for ResponseFuture<F, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.kind {
            Kind::Running { .. } => "running",
            Kind::Panicked => "panicked",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, H, T, E> Future for ResponseFuture<F, H>
where
    F: Future<Output = Result<T, E>>,
    E: From<ToolError>,
    H: OnPanic,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Running { future } => {
                match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                    Ok(poll) => poll,
                    Err(payload) => Poll::Ready(Err(caught(&*this.hook, &*payload))),
                }
            }
            KindProj::Panicked => Poll::Ready(Err(E::from(Panicked::error()))),
        }
    }
}

/// A classifier that counts a caught panic ([`is_panic`]) as a breaker failure that is
/// never retried (a panic says the tool is broken, and repeating the same call panics
/// again), and classifies every other result with `C`. Under the
/// [`DefaultClassifier`], an `INTERNAL` error is neither retried nor counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountPanics<C = DefaultClassifier> {
    inner: C,
}

impl CountPanics {
    /// Panics counted, everything else by the [`DefaultClassifier`].
    #[must_use]
    pub fn new() -> Self {
        CountPanics {
            inner: DefaultClassifier,
        }
    }
}

impl<C> CountPanics<C> {
    /// Panics counted, everything else by `inner`.
    #[must_use]
    pub fn wrap(inner: C) -> Self {
        CountPanics { inner }
    }
}

impl<Res, C: Classify<Res>> Classify<Res> for CountPanics<C> {
    fn classify(&self, result: &Result<Res, ToolError>) -> Outcome {
        match result {
            Err(e) if is_panic(e) => Outcome::Failure(Failure {
                kind: ErrorKind::Internal,
                retriable: false,
                counts_for_breaker: true,
                retry_after: None,
            }),
            _ => self.inner.classify(result),
        }
    }
}
