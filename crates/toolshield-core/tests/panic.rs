//! `CatchPanic`: a panic of the inner service, wherever it happens, becomes an `INTERNAL`
//! error without its text.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use toolshield_core::panic::{is_panic, CatchPanic, CatchPanicLayer, CountPanics, Panicked};
use toolshield_core::{
    BoxError, Classify, DefaultClassifier, ErrorKind, Outcome, ToolError, ToolResponse,
};
use tower_service::Service;

const SECRET: &str = "api_key=sk-live-123 missing argument `city`";

/// Where the test service panics.
#[derive(Clone, Copy, PartialEq)]
enum PanicIn {
    Nowhere,
    PollReady,
    Call,
    Future,
}

#[derive(Clone)]
struct Tool(PanicIn);

type ToolFuture = Pin<Box<dyn Future<Output = Result<u32, ToolError>> + Send>>;

impl Service<u32> for Tool {
    type Response = u32;
    type Error = ToolError;
    type Future = ToolFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        if self.0 == PanicIn::PollReady {
            panic!("{SECRET}");
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, n: u32) -> ToolFuture {
        if self.0 == PanicIn::Call {
            panic!("{SECRET}");
        }
        let panics = self.0 == PanicIn::Future;
        Box::pin(async move {
            tokio::task::yield_now().await;
            if panics {
                let arg: Option<u32> = std::hint::black_box(None);
                arg.expect(SECRET);
            }
            Ok(n + 1)
        })
    }
}

fn recorder() -> (Arc<Mutex<Vec<String>>>, impl Fn(&str) + Clone) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    (seen, move |text: &str| {
        s.lock().unwrap().push(text.to_owned())
    })
}

fn assert_generic_panic_error(err: &ToolError) {
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(is_panic(err), "the error is marked as a panic: {err:?}");
    assert_eq!(err.message(), "the tool panicked");
    let everything = format!("{err} {err:?} {}", err.for_model("weather"));
    assert!(
        !everything.contains("sk-live") && !everything.contains("city"),
        "the panic text never reaches the error: {everything}"
    );
}

async fn call_once<S: Service<u32>>(svc: &mut S, n: u32) -> Result<S::Response, S::Error> {
    poll_fn(|cx| svc.poll_ready(cx)).await?;
    svc.call(n).await
}

#[tokio::test]
async fn a_panic_in_the_future_becomes_internal_without_its_text() {
    let (seen, hook) = recorder();
    let mut svc = CatchPanicLayer::new()
        .on_panic(hook)
        .layer(Tool(PanicIn::Future));
    let err = call_once(&mut svc, 1)
        .await
        .expect_err("the panic is an error");
    assert_generic_panic_error(&err);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![SECRET.to_owned()],
        "the hook sees the text"
    );
}

#[tokio::test]
async fn a_panic_in_call_is_caught_too() {
    let (seen, hook) = recorder();
    let mut svc = CatchPanicLayer::new()
        .on_panic(hook)
        .layer(Tool(PanicIn::Call));
    let fut = svc.call(1);
    assert_eq!(seen.lock().unwrap().len(), 1, "reported when it happens");
    let err = fut.await.expect_err("the panic is an error");
    assert_generic_panic_error(&err);
    assert_eq!(*seen.lock().unwrap(), vec![SECRET.to_owned()]);
}

#[tokio::test]
async fn a_panic_in_poll_ready_is_caught_too() {
    let mut svc = CatchPanic::new(Tool(PanicIn::PollReady));
    let err = call_once(&mut svc, 1)
        .await
        .expect_err("the panic is an error");
    assert_generic_panic_error(&err);
}

#[tokio::test]
async fn a_call_that_does_not_panic_is_untouched() {
    let (seen, hook) = recorder();
    let mut svc = CatchPanicLayer::new()
        .on_panic(hook)
        .layer(Tool(PanicIn::Nowhere));
    assert_eq!(call_once(&mut svc, 41).await.expect("ok"), 42);
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_panicking_hook_is_contained() {
    let mut svc = CatchPanicLayer::new()
        .on_panic(|_: &str| panic!("the hook itself panics"))
        .layer(Tool(PanicIn::Future));
    let err = call_once(&mut svc, 1).await.expect_err("still an error");
    assert_generic_panic_error(&err);
}

/// The same tool with tower's `BoxError` as its error type.
#[derive(Clone)]
struct BoxTool(Tool);

impl Service<u32> for BoxTool {
    type Response = u32;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, n: u32) -> Self::Future {
        let fut = self.0.call(n);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }
}

#[tokio::test]
async fn a_box_error_service_gets_the_tool_error_boxed() {
    let mut svc = CatchPanic::new(BoxTool(Tool(PanicIn::Future)));
    let err = call_once(&mut svc, 1)
        .await
        .expect_err("the panic is an error");
    let err = err.downcast::<ToolError>().expect("a boxed ToolError");
    assert_generic_panic_error(&err);
}

#[test]
fn count_panics_counts_a_panic_for_the_breaker_and_never_retries_it() {
    let panic: Result<ToolResponse, ToolError> = Err(Panicked::error());
    let outcome = CountPanics::new().classify(&panic);
    assert!(outcome.counts_as_failure(), "a panic counts: {outcome:?}");
    assert!(!outcome.is_retriable(), "a panic is never retried");
    assert_eq!(outcome.kind(), Some(ErrorKind::Internal));
    // The default classifier alone ignores INTERNAL: that is why the breaker needs this.
    assert_eq!(DefaultClassifier.classify(&panic), Outcome::Ignored);
    // Anything else is classified as the inner classifier says.
    let other: Result<ToolResponse, ToolError> = Err(ToolError::internal("a toolshield defect"));
    assert!(!is_panic(other.as_ref().unwrap_err()));
    assert_eq!(CountPanics::new().classify(&other), Outcome::Ignored);
    let timeout: Result<ToolResponse, ToolError> = Err(ToolError::timeout("slow"));
    assert_eq!(
        CountPanics::new().classify(&timeout),
        DefaultClassifier.classify(&timeout)
    );
}
