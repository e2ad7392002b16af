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

/// What one attempt of the randomized test's tool saw.
#[derive(Debug)]
struct Attempt {
    execution_id: u128,
    reports: u64,
    // `Some` for an attempt that ran to its end: whether its attempt token was cancelled
    // by then.
    finished_cancelled: Option<bool>,
}

/// A small deterministic generator (xorshift), so a failing seed can be run again.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Many clones of one template, sent at random times through one tool's stack, with
/// random latencies on either side of the attempt timeout and callers that give up at
/// random: every attempt that runs to its end finds its attempt token uncancelled
/// (another call's timeout or dropped future never reaches it), every attempt has an
/// execution id of its own, each successful call reports exactly its own attempts'
/// progress, and the template is left as it was.
async fn clones_at_random(tool: &'static str, seed: u64) {
    const CALLS: usize = 40;
    let config = r#"
[tools.once]
kind = "read_only"
timeout = { attempt = "2s" }
retry = { max_attempts = 1 }
breaker = { consecutive_failures = 0, window = { type = "count", size = 1000 }, min_calls = 1000 }

[tools.retried]
kind = "read_only"
timeout = { attempt = "2s" }
retry = { max_attempts = 3, backoff = { strategy = "fixed", min = "100ms", max = "100ms" } }
breaker = { consecutive_failures = 0, window = { type = "count", size = 1000 }, min_calls = 1000 }
"#;
    let shield =
        Shield::from_config(ShieldConfig::from_toml_str(config).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
    let rng = Arc::new(std::sync::Mutex::new(Rng(seed)));
    let log: Arc<std::sync::Mutex<Vec<Attempt>>> = Arc::default();
    let svc = {
        let (rng, log) = (Arc::clone(&rng), Arc::clone(&log));
        shield.wrap(
            tool,
            service_fn(move |req: ToolRequest| {
                let (rng, log) = (Arc::clone(&rng), Arc::clone(&log));
                async move {
                    // Odd milliseconds: no attempt ends on the instant its timeout fires.
                    let (latency, reports) = {
                        let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
                        (rng.below(1500) * 2 + 1, rng.below(4))
                    };
                    for _ in 0..reports {
                        req.progress().report(None, None, Some("step"));
                    }
                    let at = {
                        let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                        log.push(Attempt {
                            execution_id: req.execution_id().as_u128(),
                            reports,
                            finished_cancelled: None,
                        });
                        log.len() - 1
                    };
                    tokio::time::sleep(Duration::from_millis(latency)).await;
                    let cancelled = req.attempt_token().is_cancelled();
                    log.lock().unwrap_or_else(|e| e.into_inner())[at].finished_cancelled =
                        Some(cancelled);
                    Ok::<_, ToolError>(ToolResponse::new(json!(latency)))
                }
            }),
        )
    };
    let heard = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&heard);
    let template = ToolRequest::new(tool, json!({"q": 1}))
        .kind(CallKind::ReadOnly)
        .on_progress(move |_event| {
            counter.fetch_add(1, Ordering::Relaxed);
        });

    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..CALLS {
        let (start, give_up) = {
            let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
            let start = rng.below(1000);
            // A third of the callers give up after 0.5 to 4 s.
            let give_up = (rng.below(3) == 0).then(|| 500 + rng.below(3500));
            (start, give_up)
        };
        let (svc, req) = (svc.clone(), template.clone());
        calls.spawn(async move {
            tokio::time::sleep(Duration::from_millis(start)).await;
            let call = svc.oneshot(req);
            match give_up {
                Some(ms) => tokio::time::timeout(Duration::from_millis(ms), call)
                    .await
                    .ok(),
                None => Some(call.await),
            }
        });
    }
    let mut answers = Vec::new();
    while let Some(joined) = calls.join_next().await {
        if let Some(Ok(resp)) = joined.expect("no call panics") {
            answers.push(resp);
        }
    }

    let log = log.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = format!("tool {tool}, seed {seed}");
    assert!(
        log.iter().any(|a| a.finished_cancelled.is_some()) && log.len() > CALLS / 2,
        "{ctx}: too few attempts ran to say anything: {log:?}"
    );
    for a in log.iter() {
        assert_ne!(
            a.finished_cancelled,
            Some(true),
            "{ctx}: an attempt that ran to its end found its token cancelled by another call: {a:?}"
        );
    }
    let mut ids: Vec<_> = log.iter().map(|a| a.execution_id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        log.len(),
        "{ctx}: two attempts shared an execution id"
    );
    assert!(!ids.contains(&template.execution_id().as_u128()), "{ctx}");
    for resp in &answers {
        let id = resp.provenance.execution_id.expect("stamped").as_u128();
        let attempt = log
            .iter()
            .find(|a| a.execution_id == id)
            .unwrap_or_else(|| panic!("{ctx}: no attempt ran as {id}"));
        assert_eq!(attempt.finished_cancelled, Some(false), "{ctx}");
        if tool == "once" {
            // One attempt per call: its reports are the call's, and no other call's.
            assert_eq!(
                resp.provenance.progress_reports, attempt.reports,
                "{ctx}: {:?}",
                resp.provenance
            );
        }
    }
    let made: u64 = log.iter().map(|a| a.reports).sum();
    assert_eq!(
        heard.load(Ordering::Relaxed),
        made,
        "{ctx}: the template's callback hears every report of every call"
    );
    assert_eq!(template.progress().reports(), 0, "{ctx}");
    assert!(!template.attempt_token().is_cancelled(), "{ctx}");
    assert!(!template.call_token().is_cancelled(), "{ctx}");
}

#[tokio::test(start_paused = true)]
async fn clones_sent_at_random_never_reach_each_others_attempts() {
    for seed in 1..=12u64 {
        clones_at_random("once", seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)).await;
        clones_at_random("retried", seed.wrapping_mul(0xBF58_476D_1CE4_E5B9)).await;
    }
}
