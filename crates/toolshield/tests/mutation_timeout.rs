//! A mutating call that times out after it was sent may have taken effect: the shield
//! does not send it again (key or not), records its outcome as unknown, and tells every
//! duplicate so, while a failure that proves nothing ran is still retried.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolshield::prelude::*;
use toolshield::BoxTool;
use tower::{service_fn, ServiceExt};

const CONFIG: &str = r#"
[defaults]
timeout = { attempt = "1s", total = "60s" }
retry = { max_attempts = 3, backoff = { strategy = "none" } }

[tools.pay]
kind = "mutating"
"#;

/// A tool whose first run takes effect and then hangs past the attempt timeout, and whose
/// later runs answer `first` with `then` (a success, or an error of that kind).
fn pay(runs: &Arc<AtomicU32>, then: Option<ErrorKind>) -> BoxTool {
    let runs = Arc::clone(runs);
    BoxTool::new(service_fn(move |_req: ToolRequest| {
        let n = runs.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            match then {
                None => Ok(ToolResponse::new(json!({"charged": true}))),
                Some(kind) => Err(ToolError::new(kind, "second run")),
            }
        }
    }))
}

fn order(key: &str) -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": 42})).idempotency_key(key)
}

fn shield() -> Shield {
    Shield::from_config(ShieldConfig::from_toml_str(CONFIG).expect("config")).expect("shield")
}

#[tokio::test(start_paused = true)]
async fn a_keyed_mutation_that_times_out_runs_once_and_ends_outcome_unknown() {
    let shield = shield();
    // Were it sent again, the second run would succeed: a double charge reported as one.
    for then in [None, Some(ErrorKind::ConnectionFailed)] {
        let runs = Arc::new(AtomicU32::new(0));
        let svc = shield.wrap("pay", pay(&runs, then));
        let key = format!("order-{then:?}");
        let e = svc
            .clone()
            .oneshot(order(&key))
            .await
            .expect_err("the outcome is unknown");
        assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "not sent again");
        // A duplicate is told the same and runs nothing.
        let dup = svc.oneshot(order(&key)).await.expect_err("recorded");
        assert_eq!(dup.kind(), ErrorKind::OutcomeUnknown);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "a duplicate runs nothing");
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyed_mutation_whose_first_attempt_was_refused_is_retried() {
    let shield = shield();
    let runs = Arc::new(AtomicU32::new(0));
    let r = Arc::clone(&runs);
    // Refused before anything was sent, then accepted: nothing ran twice.
    let tool = BoxTool::new(service_fn(move |_req: ToolRequest| {
        let n = r.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(ToolError::new(ErrorKind::ConnectionFailed, "refused"))
            } else {
                Ok(ToolResponse::new(json!({"charged": true})))
            }
        }
    }));
    let res = shield
        .wrap("pay", tool)
        .oneshot(order("refused-first"))
        .await
        .expect("retried to success");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(res.provenance.attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_read_only_call_that_times_out_is_still_retried() {
    let shield = Shield::from_config(
        ShieldConfig::from_toml_str(
            r#"
[defaults]
timeout = { attempt = "1s", total = "60s" }
retry = { max_attempts = 3, backoff = { strategy = "none" } }

[tools.quote]
kind = "read_only"
"#,
        )
        .expect("config"),
    )
    .expect("shield");
    let runs = Arc::new(AtomicU32::new(0));
    let res = shield
        .wrap("quote", pay(&runs, None))
        .oneshot(ToolRequest::new("quote", json!({"s": "X"})))
        .await
        .expect("the second attempt answers");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(res.provenance.attempts, 2);
}
