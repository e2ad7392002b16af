//! The generic layers around any tower service: here a `Service<String>` whose error is
//! tower's `BoxError`, with no adapter type. `cargo run --example any_service`
//!
//! The service is a small lookup that fails twice with a reset connection, then answers;
//! then a slow lookup; then an outage that opens the breaker.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use toolshield_breaker::BreakerLayer;
use toolshield_core::ErrorKind;
use toolshield_retry::RetryLayer;
use toolshield_timeout::TimeoutLayer;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&calls);
    let lookup = service_fn(move |query: String| {
        let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            match query.as_str() {
                "slow" => tokio::time::sleep(Duration::from_secs(5)).await,
                "down" => return Err::<String, BoxError>("upstream is down".into()),
                _ if n <= 2 => {
                    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                    return Err(Box::new(reset) as BoxError);
                }
                _ => {}
            }
            Ok(format!("result for {query}"))
        }
    });

    // The whole stack: no adapter, no map_err.
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(3))
        .layer(BreakerLayer::default())
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(lookup);

    // 1. Two connection resets (CONNECTION_FAILED, retriable), then an answer.
    let answer = svc.clone().oneshot("rust".to_owned()).await?;
    println!(
        "1. {answer:?} after {} calls of the service",
        calls.load(Ordering::SeqCst)
    );
    assert_eq!(answer, "result for rust");
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // 2. A slow call: every attempt is cut at 200 ms, and the caller gets TIMEOUT.
    let err = svc.clone().oneshot("slow".to_owned()).await.unwrap_err();
    println!(
        "2. slow lookup: {} after {} attempts",
        err.code(),
        err.attempts()
    );
    assert_eq!(err.kind(), ErrorKind::Timeout);

    // 3. An outage: an unknown boxed error is EXECUTION_FAILED (not retried); five in a
    //    row open the breaker (the timeouts above counted too), and the next call is
    //    rejected without reaching the service.
    let mut codes = Vec::new();
    for _ in 0..4 {
        let err = svc.clone().oneshot("down".to_owned()).await.unwrap_err();
        codes.push(err.code());
    }
    println!("3. outage: {}", codes.join(", "));
    assert_eq!(codes.last(), Some(&"CIRCUIT_OPEN"));
    let before = calls.load(Ordering::SeqCst);
    let err = svc.clone().oneshot("rust".to_owned()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "rejected without a call"
    );
    println!(
        "   then {} without calling the service; the model would read: {}",
        err.code(),
        err.for_model("lookup")
    );
    Ok(())
}
