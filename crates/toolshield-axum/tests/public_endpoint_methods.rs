//! `/healthz` and `/metrics` answer a method they do not take as the admin routes do: a
//! JSON 405 naming the methods in `Allow`, never an empty body a client cannot parse.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use toolshield_axum::ShieldRouter;
use toolshield_metrics::local_prometheus;

use support::{request, serve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_metrics_answer_a_wrong_method_with_a_json_405() {
    let router = ShieldRouter::new()
        .core_check("db", || async { Ok::<_, String>(()) })
        .metrics(local_prometheus())
        .build();
    let addr = serve(router).await;
    for path in ["healthz", "metrics"] {
        let a = request("POST", format!("http://{addr}/{path}"), None).await;
        assert_eq!(a.status, 405, "{path}: {a:?}");
        assert_eq!(a.content_type, "application/json", "{path}: {a:?}");
        let body = a.json();
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains("GET")),
            "{path}: {body}"
        );
    }
    // The right method still gets the page.
    let a = request("GET", format!("http://{addr}/healthz"), None).await;
    assert_eq!(a.status, 200);
}

/// A collector that panics (one of the application's own) does not take the connection
/// down: `/metrics` answers a JSON 500, and once the collector recovers the next scrape
/// is the exposition again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_collector_makes_metrics_a_json_500_not_a_dropped_connection() {
    let exporter = local_prometheus();
    let panicked = Arc::new(AtomicBool::new(false));
    let once = Arc::clone(&panicked);
    exporter.add_collector(move || {
        if !once.swap(true, Ordering::SeqCst) {
            panic!("collector bug");
        }
    });
    let router = ShieldRouter::new().metrics(exporter).build();
    let addr = serve(router).await;
    let a = request("GET", format!("http://{addr}/metrics"), None).await;
    assert_eq!(a.status, 500, "{a:?}");
    assert_eq!(a.content_type, "application/json", "{a:?}");
    let body = a.json();
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        !error.is_empty() && !error.contains("collector bug"),
        "{body}"
    );
    assert!(panicked.load(Ordering::SeqCst));

    let a = request("GET", format!("http://{addr}/metrics"), None).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.content_type.starts_with("text/plain"), "{a:?}");
}
