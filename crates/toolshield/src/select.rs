//! [`Select`]: one of two services, chosen when a stack is built.
//!
//! tower's `Either` does the same; this one is inlined into its caller, so the chosen
//! service's future is built in place in the future around it instead of being built
//! and then moved into it. A tool's stack holds several of these (a layer present or
//! left out, the breaker pinned or not, a fallback chain or none), and each move of a
//! nested future copies every future below it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::{Layer, Service};

/// One of two services, chosen when the stack is built; both answer with the same
/// response and error types.
#[derive(Debug)]
pub(crate) enum Select<A, B> {
    /// The first.
    A(A),
    /// The second.
    B(B),
}

/// Inlined into the clone around it, as its `call` is: a stack is cloned for each call,
/// and a clone made out of line is built aside and then copied into the enum around it,
/// once per level of the stack.
impl<A: Clone, B: Clone> Clone for Select<A, B> {
    #[inline(always)]
    fn clone(&self) -> Self {
        match self {
            Select::A(a) => Select::A(a.clone()),
            Select::B(b) => Select::B(b.clone()),
        }
    }
}

impl<A, B, Req> Service<Req> for Select<A, B>
where
    A: Service<Req>,
    B: Service<Req, Response = A::Response, Error = A::Error>,
{
    type Response = A::Response;
    type Error = A::Error;
    type Future = SelectFuture<A::Future, B::Future>;

    #[inline(always)]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self {
            Select::A(a) => a.poll_ready(cx),
            Select::B(b) => b.poll_ready(cx),
        }
    }

    #[inline(always)]
    fn call(&mut self, req: Req) -> Self::Future {
        match self {
            Select::A(a) => SelectFuture::A { inner: a.call(req) },
            Select::B(b) => SelectFuture::B { inner: b.call(req) },
        }
    }
}

pin_project! {
    /// The future of [`Select`].
    #[project = SelectProj]
    pub(crate) enum SelectFuture<A, B> {
        /// The first service's.
        A { #[pin] inner: A },
        /// The second service's.
        B { #[pin] inner: B },
    }
}

impl<A, B> Future for SelectFuture<A, B>
where
    A: Future,
    B: Future<Output = A::Output>,
{
    type Output = A::Output;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            SelectProj::A { inner } => inner.poll(cx),
            SelectProj::B { inner } => inner.poll(cx),
        }
    }
}

/// A layer that is present or left out: [`Select::A`] around the service when present,
/// the service itself ([`Select::B`]) when not.
#[derive(Debug, Clone)]
pub(crate) struct Optional<L>(pub(crate) Option<L>);

impl<L, S> Layer<S> for Optional<L>
where
    L: Layer<S>,
{
    type Service = Select<L::Service, S>;

    fn layer(&self, inner: S) -> Self::Service {
        match &self.0 {
            Some(layer) => Select::A(layer.layer(inner)),
            None => Select::B(inner),
        }
    }
}

/// One of two layers, chosen when the stack is built (the breaker pinned to a tool or
/// not): the service it makes is the same choice.
impl<LA, LB, S> Layer<S> for Select<LA, LB>
where
    LA: Layer<S>,
    LB: Layer<S>,
{
    type Service = Select<LA::Service, LB::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        match self {
            Select::A(layer) => Select::A(layer.layer(inner)),
            Select::B(layer) => Select::B(layer.layer(inner)),
        }
    }
}

/// Boxes the future of the service it wraps (no trait object: the layers above move a
/// pointer, and polling it is a direct call), allocating the box before the call so the
/// future can be built in it rather than built and then moved there.
#[derive(Debug, Clone)]
pub(crate) struct BoxCall<S>(pub(crate) S);

impl<S, Req> Service<Req> for BoxCall<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<S::Future>>;

    #[inline(always)]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    #[inline(always)]
    fn call(&mut self, req: Req) -> Self::Future {
        let slot = Box::<S::Future>::new_uninit();
        Box::into_pin(Box::write(slot, self.0.call(req)))
    }
}
