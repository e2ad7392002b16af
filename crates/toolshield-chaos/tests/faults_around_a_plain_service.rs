//! The fault-injection layer around a plain tower service (`Service<String>` whose error
//! is tower's `BoxError`), with no adapter: injected faults are typed `ToolError`s, a
//! latency fault calls the very service that was polled ready, the inner service's
//! readiness reaches the caller, and the inner service's own errors come out classified.
//! On tokio's paused clock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;
use toolshield_chaos::{
    ChaosConfig, ChaosLayer, ErrorFault, FaultKind, HangFault, InBandFault, LatencyFault,
};
use toolshield_contract::{BoxError, ErrorKind, ToolError};
use tower::{service_fn, Layer, Service, ServiceExt};

fn on() -> ChaosConfig {
    ChaosConfig {
        enabled: true,
        seed: Some(7),
        ..ChaosConfig::default()
    }
}

/// A plain lookup that counts its calls and answers at once.
fn lookup(
    calls: Arc<AtomicUsize>,
) -> impl Service<String, Response = String, Error = BoxError, Future = impl Send> + Clone {
    service_fn(move |q: String| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(format!("answer to {q}")) }
    })
}

#[tokio::test(start_paused = true)]
async fn an_injected_error_on_a_plain_service_is_a_typed_tool_error_without_a_call() {
    let cfg = ChaosConfig {
        error: vec![ErrorFault {
            rate: 1.0,
            kind: ErrorKind::UpstreamUnavailable,
            retry_after: Some(Duration::from_secs(3)),
        }],
        ..on()
    };
    let layer = ChaosLayer::new("lookup", &cfg);
    let calls = Arc::new(AtomicUsize::new(0));
    let err: ToolError = layer
        .layer(lookup(Arc::clone(&calls)))
        .oneshot(String::from("rust"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the service is not called");
    assert_eq!(layer.stats().injected(FaultKind::Error), 1);
}

#[tokio::test(start_paused = true)]
async fn an_injected_in_band_fault_on_a_plain_response_is_an_error_of_its_kind() {
    let cfg = ChaosConfig {
        in_band: Some(InBandFault {
            rate: 1.0,
            kind: ErrorKind::ExecutionFailed,
        }),
        ..on()
    };
    let layer = ChaosLayer::new("lookup", &cfg);
    let calls = Arc::new(AtomicUsize::new(0));
    let err = layer
        .layer(lookup(Arc::clone(&calls)))
        .oneshot(String::from("rust"))
        .await
        .unwrap_err();
    // A `String` cannot carry an in-band failure: the documented fallback is an error.
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(layer.stats().injected(FaultKind::InBand), 1);
}

/// A service with one permit per readiness: `poll_ready` grants it, `call` spends it. A
/// call without a permit (on a clone that was never polled ready) is counted and refused.
/// A clone starts without a permit.
struct OnePermit {
    ready: bool,
    calls: Arc<AtomicUsize>,
    unready_calls: Arc<AtomicUsize>,
}

impl Clone for OnePermit {
    fn clone(&self) -> Self {
        OnePermit {
            ready: false,
            calls: Arc::clone(&self.calls),
            unready_calls: Arc::clone(&self.unready_calls),
        }
    }
}

impl Service<String> for OnePermit {
    type Response = String;
    type Error = BoxError;
    type Future = std::future::Ready<Result<String, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, q: String) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !std::mem::replace(&mut self.ready, false) {
            self.unready_calls.fetch_add(1, Ordering::SeqCst);
            return std::future::ready(Err("called without readiness".into()));
        }
        std::future::ready(Ok(format!("answer to {q}")))
    }
}

#[tokio::test(start_paused = true)]
async fn an_injected_latency_waits_then_calls_the_service_that_was_polled_ready() {
    let cfg = ChaosConfig {
        latency: Some(LatencyFault {
            rate: 1.0,
            delay: Duration::from_secs(2),
        }),
        ..on()
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let unready_calls = Arc::new(AtomicUsize::new(0));
    let svc = ChaosLayer::new("lookup", &cfg).layer(OnePermit {
        ready: false,
        calls: Arc::clone(&calls),
        unready_calls: Arc::clone(&unready_calls),
    });
    let started = Instant::now();
    let answer = svc.oneshot(String::from("rust")).await.unwrap();
    assert_eq!(answer, "answer to rust");
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2),
        "delayed by the fault"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(unready_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn an_injected_hang_on_a_plain_service_ends_when_the_caller_stops_waiting() {
    let cfg = ChaosConfig {
        hang: Some(HangFault { rate: 1.0 }),
        ..on()
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ChaosLayer::new("lookup", &cfg).layer(lookup(Arc::clone(&calls)));
    let waited =
        tokio::time::timeout(Duration::from_secs(30), svc.oneshot(String::from("rust"))).await;
    assert!(waited.is_err(), "a hang answers nothing");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// A service that is not ready until the gate is opened; it registers its waker so the
/// runtime can go idle (and the paused clock advance) while it waits.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<AtomicBool>,
    waker: Arc<Mutex<Option<Waker>>>,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        if let Some(waker) = self.waker.lock().unwrap().take() {
            waker.wake();
        }
    }
}

impl Service<String> for Gate {
    type Response = String;
    type Error = BoxError;
    type Future = std::future::Ready<Result<String, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.open.load(Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    fn call(&mut self, q: String) -> Self::Future {
        std::future::ready(Ok(q))
    }
}

#[tokio::test(start_paused = true)]
async fn the_readiness_of_the_inner_service_reaches_the_caller() {
    let gate = Gate::default();
    let mut svc = ChaosLayer::new("lookup", &on()).layer(gate.clone());
    let waited = tokio::time::timeout(Duration::from_secs(1), svc.ready()).await;
    assert!(waited.is_err(), "not ready while the inner service is not");
    gate.open();
    let answer = svc
        .ready()
        .await
        .unwrap()
        .call(String::from("through"))
        .await;
    assert_eq!(answer.unwrap(), "through");
}

#[tokio::test(start_paused = true)]
async fn errors_of_the_plain_service_come_out_classified() {
    let svc = ChaosLayer::new("lookup", &on()).layer(service_fn(|_q: String| async {
        Err::<String, BoxError>(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))
    }));
    let err = svc.oneshot(String::from("rust")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed);
}
