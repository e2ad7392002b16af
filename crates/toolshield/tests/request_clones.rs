//! Clones of one request sent through the default stack as calls of their own: they
//! share what the caller put on the template (the call token, the progress callback),
//! never what belongs to one call (its attempt token, its progress count and message).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield::prelude::*;
use tower::{service_fn, ServiceExt};

const CONFIG: &str = r#"
[tools.t]
kind = "read_only"
timeout = { attempt = "2s" }
"#;

fn shield() -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(CONFIG).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(start_paused = true)]
async fn one_clones_timeout_does_not_cancel_another_clones_attempt() {
    let shield = shield();
    // Works 5 s, ignoring its token: every attempt times out at 2 s.
    let slow = shield.wrap(
        "t",
        service_fn(|_req: ToolRequest| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, ToolError>(ToolResponse::new(json!("late")))
        }),
    );
    // Works 1.5 s, then says whether its attempt token was cancelled meanwhile.
    let steady = shield.wrap(
        "t",
        service_fn(|req: ToolRequest| async move {
            let token = req.attempt_token().clone();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Ok::<_, ToolError>(ToolResponse::new(
                json!({ "attempt_cancelled": token.is_cancelled() }),
            ))
        }),
    );
    let template = ToolRequest::new("t", json!({"q": 1})).kind(CallKind::ReadOnly);
    let late = async {
        // Starts 1 s after the slow call: runs while the slow call's attempt times out.
        tokio::time::sleep(Duration::from_secs(1)).await;
        steady.oneshot(template.clone()).await
    };
    let (slow, steady) = tokio::join!(slow.oneshot(template.clone()), late);
    assert_eq!(slow.expect_err("times out").kind(), ErrorKind::Timeout);
    let steady = steady.expect("the steady call succeeds");
    assert_eq!(
        steady.output,
        json!({"attempt_cancelled": false}),
        "the slow call's timeout cancelled the steady call's attempt token"
    );
}

#[tokio::test(start_paused = true)]
async fn each_clone_reports_only_its_own_progress_and_the_callback_sees_all() {
    let shield = shield();
    let reporter = |count: usize, message: &'static str| {
        service_fn(move |req: ToolRequest| async move {
            for _ in 0..count {
                req.progress().report(None, None, Some(message));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, ToolError>(ToolResponse::new(json!(message)))
        })
    };
    let three = shield.wrap("t", reporter(3, "from the first"));
    let one = shield.wrap("t", reporter(1, "from the second"));
    let seen = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&seen);
    let template = ToolRequest::new("t", json!({"q": 1}))
        .kind(CallKind::ReadOnly)
        .on_progress(move |_event| {
            counter.fetch_add(1, Ordering::Relaxed);
        });

    let (a, b) = tokio::join!(
        three.oneshot(template.clone()),
        one.oneshot(template.clone())
    );
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert_eq!(a.provenance.progress_reports, 3, "{:?}", a.provenance);
    assert_eq!(
        a.provenance.progress_message.as_deref(),
        Some("from the first")
    );
    assert_eq!(b.provenance.progress_reports, 1, "{:?}", b.provenance);
    assert_eq!(
        b.provenance.progress_message.as_deref(),
        Some("from the second")
    );
    // The caller's callback, put on the template, hears both calls.
    assert_eq!(seen.load(Ordering::Relaxed), 4);
    // and the template kept no count of calls it never made.
    assert_eq!(template.progress().reports(), 0);
}

#[tokio::test(start_paused = true)]
async fn each_clone_is_an_execution_of_its_own_in_its_provenance() {
    let shield = shield();
    let tool = shield.wrap(
        "t",
        service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!(1))) }),
    );
    let template = ToolRequest::new("t", json!({"q": 1})).kind(CallKind::ReadOnly);
    let (a, b) = tokio::join!(
        tool.clone().oneshot(template.clone()),
        tool.clone().oneshot(template.clone())
    );
    let (a, b) = (a.expect("first"), b.expect("second"));
    let (a, b) = (a.provenance.execution_id, b.provenance.execution_id);
    assert!(a.is_some() && b.is_some(), "{a:?} {b:?}");
    assert_ne!(a, b, "two calls reported one execution id");
    assert_ne!(a, Some(template.execution_id()));
}
