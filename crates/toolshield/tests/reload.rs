//! `Shield::reload`: new calls get the new settings, calls in flight finish under the old
//! ones, nothing is lost under load, breaker states, cache entries and idempotency records
//! are kept, and an invalid configuration changes nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield::shield::{Shield, ToolRouter};
use toolshield_breaker::CircuitState;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolService};
use toolshield_test::problem_fields;
use tower::{service_fn, ServiceExt};

fn config(toml: &str) -> ShieldConfig {
    ShieldConfig::from_toml_str(toml).expect("config")
}

fn shield(toml: &str) -> Shield {
    Shield::from_config(config(toml)).expect("shield")
}

/// `flaky` retries `attempts` times, without waits or budget, and its breaker never
/// trips (the first attempt's OVERLOADED is not a breaker failure anyway).
fn flaky(attempts: u32) -> String {
    format!(
        r#"
        [tools.flaky]
        kind = "read_only"
        retry = {{ max_attempts = {attempts}, backoff = {{ strategy = "none" }}, budget = {{ enabled = false }} }}
        "#
    )
}

/// Attempts per call id, and how many attempts are running now.
/// A tool answering `{"n": n}` for its n-th call, counted in `calls`.
fn counting(calls: &Arc<AtomicUsize>) -> impl ToolService {
    let calls = Arc::clone(calls);
    service_fn(move |_req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, ToolError>(ToolResponse::new(json!({ "n": n }))) }
    })
}

#[derive(Clone, Default)]
struct Ledger {
    attempts: Arc<Mutex<HashMap<u64, u32>>>,
    running: Arc<AtomicUsize>,
}

/// A tool whose first attempt of each call (`{"i": id}`) fails with OVERLOADED after
/// `delay`, and whose later attempts succeed after `delay`: a call succeeds only if the
/// retry policy allows a second attempt.
fn first_attempt_fails(ledger: &Ledger, delay: Duration) -> impl ToolService {
    let ledger = ledger.clone();
    service_fn(move |req: ToolRequest| {
        let ledger = ledger.clone();
        async move {
            let id = req.payload()["i"].as_u64().unwrap_or(u64::MAX);
            let attempt = {
                let mut map = ledger.attempts.lock().expect("ledger");
                let n = map.entry(id).or_insert(0);
                *n += 1;
                *n
            };
            ledger.running.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            ledger.running.fetch_sub(1, Ordering::SeqCst);
            if attempt == 1 {
                Err(ToolError::new(ErrorKind::Overloaded, "busy"))
            } else {
                Ok(ToolResponse::new(json!({ "i": id, "attempt": attempt })))
            }
        }
    })
}

fn req(tool: &str, i: u64) -> ToolRequest {
    ToolRequest::new(tool, json!({ "i": i })).kind(CallKind::ReadOnly)
}

#[tokio::test(start_paused = true)]
async fn a_reload_under_load_loses_no_call_and_calls_started_after_it_get_the_new_retry_count() {
    let shield = shield(&flaky(1));
    let ledger = Ledger::default();
    let router = shield
        .router()
        .tool(
            "flaky",
            first_attempt_fails(&ledger, Duration::from_millis(50)),
        )
        .build()
        .expect("router");

    let mut calls = Vec::new();
    let mut in_flight_at_reload = 0;
    // 1,000 calls, 10 per millisecond, each attempt 50 ms long: about 500 are running
    // when the reload comes, half way through.
    for i in 0..1_000u64 {
        if i == 500 {
            in_flight_at_reload = ledger.running.load(Ordering::SeqCst);
            let summary = shield.reload(config(&flaky(2))).expect("reload");
            assert_eq!(summary.generation, 2);
            assert_eq!(summary.changed, ["flaky"]);
        }
        let (shield, router) = (shield.clone(), router.clone());
        calls.push(tokio::spawn(async move {
            // Read in the same poll as the router's `poll_ready`: on this single-threaded
            // runtime no reload can come in between.
            let generation = shield.generation();
            (generation, router.oneshot(req("flaky", i)).await)
        }));
        if i % 10 == 9 {
            tokio::time::advance(Duration::from_millis(1)).await;
        }
    }
    assert!(
        in_flight_at_reload >= 300,
        "the reload must come while calls run: {in_flight_at_reload} running"
    );

    let (mut old, mut new) = (0, 0);
    for (i, call) in calls.into_iter().enumerate() {
        let (generation, result) = call.await.expect("no call panics or is lost");
        let attempts = ledger.attempts.lock().expect("ledger")[&(i as u64)];
        match generation {
            1 => {
                old += 1;
                let err = result.expect_err("one attempt under the old settings");
                assert_eq!(err.kind(), ErrorKind::Overloaded, "call {i}");
                assert_eq!(attempts, 1, "call {i} started before the reload");
            }
            2 => {
                new += 1;
                let ok = result.unwrap_or_else(|e| panic!("call {i} after the reload: {e}"));
                assert_eq!(ok.output["attempt"], 2);
                assert_eq!(attempts, 2, "call {i} started after the reload");
            }
            g => panic!("unexpected generation {g}"),
        }
    }
    assert_eq!((old, new), (500, 500));
    assert_eq!(ledger.running.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_service_wrapped_before_a_reload_follows_it_and_a_tool_added_by_it_gets_its_section() {
    // `flaky` has no section yet: it runs on the defaults (one attempt).
    let shield = shield(
        r#"
        [defaults]
        retry = { max_attempts = 1 }
        "#,
    );
    let ledger = Ledger::default();
    let wrapped = shield.wrap(
        "flaky",
        first_attempt_fails(&ledger, Duration::from_millis(5)),
    );
    let err = wrapped
        .clone()
        .oneshot(req("flaky", 1))
        .await
        .expect_err("defaults: one attempt");
    assert_eq!(err.kind(), ErrorKind::Overloaded);

    let summary = shield.reload(config(&flaky(3))).expect("reload");
    assert_eq!(summary.added, ["flaky"]);
    assert!(shield.tool_names().contains(&"flaky".to_owned()));
    let ok = wrapped
        .clone()
        .oneshot(req("flaky", 2))
        .await
        .expect("its own section: 3 attempts");
    assert_eq!(ok.output["attempt"], 2);

    // Removing the section puts it back on the defaults.
    let summary = shield
        .reload(config("[defaults]\nretry = { max_attempts = 1 }"))
        .expect("reload");
    assert_eq!(summary.removed, ["flaky"]);
    let err = wrapped
        .oneshot(req("flaky", 3))
        .await
        .expect_err("defaults again");
    assert_eq!(err.kind(), ErrorKind::Overloaded);
}

#[tokio::test(start_paused = true)]
async fn a_call_made_ready_before_a_reload_runs_under_the_settings_it_was_made_ready_with() {
    use tower::Service;
    let shield = shield(&flaky(1));
    let ledger = Ledger::default();
    let mut wrapped = shield.wrap(
        "flaky",
        first_attempt_fails(&ledger, Duration::from_millis(5)),
    );
    let ready = wrapped.ready().await.expect("ready");
    shield.reload(config(&flaky(2))).expect("reload");
    let err = ready
        .call(req("flaky", 1))
        .await
        .expect_err("the ready stack: one attempt");
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    // The next call is made ready again, on the new generation.
    let ok = wrapped
        .oneshot(req("flaky", 2))
        .await
        .expect("two attempts");
    assert_eq!(ok.output["attempt"], 2);
}

fn always_failing(calls: &Arc<AtomicUsize>) -> impl ToolService {
    let calls = Arc::clone(calls);
    service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down")) }
    })
}

const BREAKERS: &str = r#"
[defaults]
retry = { max_attempts = 1 }
breaker = { consecutive_failures = 2, open_wait = "30s" }

[tools.pay]
kind = "idempotent"
retry = { max_attempts = 1 }
breaker = { consecutive_failures = 3, open_wait = "30s" }
"#;

const BREAKERS_CHANGED: &str = r#"
[defaults]
retry = { max_attempts = 2, backoff = { strategy = "none" } }
breaker = { consecutive_failures = 20, open_wait = "1s" }

[tools.pay]
kind = "idempotent"
retry = { max_attempts = 2, backoff = { strategy = "none" } }
breaker = { consecutive_failures = 30, open_wait = "1s" }

# `search` ran on the defaults (the `default` registry) and now has settings of its own.
[tools.search]
kind = "read_only"
breaker = { consecutive_failures = 40 }
"#;

async fn fail_until_open(router: &ToolRouter, tool: &str, calls: &Arc<AtomicUsize>) {
    for _ in 0..3 {
        let _ = router
            .clone()
            .oneshot(ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly))
            .await;
    }
    let before = calls.load(Ordering::SeqCst);
    let err = router
        .clone()
        .oneshot(ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly))
        .await
        .expect_err("open");
    assert_eq!(err.kind(), ErrorKind::CircuitOpen, "{tool}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "{tool}: rejected without a call"
    );
}

#[tokio::test(start_paused = true)]
async fn a_breaker_open_before_a_reload_is_still_open_after_it_even_when_its_thresholds_change() {
    let shield = shield(BREAKERS);
    let (pay_calls, search_calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let router = shield
        .router()
        .tool("pay", always_failing(&pay_calls))
        .tool("search", always_failing(&search_calls))
        .build()
        .expect("router");
    fail_until_open(&router, "pay", &pay_calls).await;
    fail_until_open(&router, "search", &search_calls).await;
    let registries_before = shield.breakers();

    let summary = shield.reload(config(BREAKERS_CHANGED)).expect("reload");
    let mut kept = summary.breaker_settings_kept.clone();
    kept.sort();
    assert_eq!(kept, ["defaults", "pay", "search"]);
    assert!(summary.new_registries.is_empty(), "{summary:?}");

    for (tool, calls) in [("pay", &pay_calls), ("search", &search_calls)] {
        let before = calls.load(Ordering::SeqCst);
        let err = router
            .clone()
            .oneshot(ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly))
            .await
            .expect_err("still open");
        assert_eq!(err.kind(), ErrorKind::CircuitOpen, "{tool}");
        assert_eq!(calls.load(Ordering::SeqCst), before, "{tool}");
        assert_eq!(shield.breaker_for(tool).state(tool), CircuitState::Open);
    }
    // The same registries (handles on the same breakers), nothing added or dropped.
    assert_eq!(
        shield.breakers().keys().collect::<Vec<_>>(),
        registries_before.keys().collect::<Vec<_>>()
    );
    assert_eq!(registries_before["pay"].state("pay"), CircuitState::Open);
    assert_eq!(
        registries_before["default"].state("search"),
        CircuitState::Open
    );

    // The kept thresholds still rule: the open wait is the old 30 s, not the new 1 s.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(shield.breaker_for("pay").state("pay"), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_tool_added_by_a_reload_with_breaker_settings_of_its_own_gets_a_new_registry() {
    let shield = shield(BREAKERS);
    let summary = shield
        .reload(config(&format!(
            "{BREAKERS}\n[tools.mail]\nbreaker = {{ consecutive_failures = 1 }}\nretry = {{ max_attempts = 1 }}"
        )))
        .expect("reload");
    assert_eq!(summary.added, ["mail"]);
    assert_eq!(summary.new_registries, ["mail"]);
    assert!(summary.breaker_settings_kept.is_empty(), "{summary:?}");
    let calls = Arc::new(AtomicUsize::new(0));
    let router = shield
        .router()
        .tool("mail", always_failing(&calls))
        .build()
        .expect("router");
    let _ = router
        .clone()
        .oneshot(ToolRequest::new("mail", json!({})).kind(CallKind::ReadOnly))
        .await;
    // One failure trips it: the new registry has the new tool's thresholds.
    assert_eq!(shield.breakers()["mail"].state("mail"), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_configuration_is_rejected_with_every_problem_and_the_running_one_stays() {
    let shield = shield(&flaky(2));
    let ledger = Ledger::default();
    let router = shield
        .router()
        .tool(
            "flaky",
            first_attempt_fails(&ledger, Duration::from_millis(5)),
        )
        .build()
        .expect("router");

    let mut bad = config(&flaky(5));
    bad.defaults.breaker.failure_rate = 250.0;
    if let Some(t) = bad.tools.get_mut("flaky") {
        t.retry.max_attempts = 0;
        t.timeout.attempt = Duration::ZERO;
    }
    let err = shield.reload(bad).expect_err("invalid");
    let fields = problem_fields(&err);
    for want in [
        "defaults.breaker.failure_rate",
        "tools.flaky.retry.max_attempts",
        "tools.flaky.timeout.attempt",
    ] {
        assert!(fields.contains(&want), "{want} in {fields:?}");
    }
    assert_eq!(shield.generation(), 1);
    assert_eq!(shield.config().tools["flaky"].retry.max_attempts, 2);
    let ok = router
        .oneshot(req("flaky", 1))
        .await
        .expect("the old settings: 2 attempts");
    assert_eq!(ok.output["attempt"], 2);
}

#[tokio::test(start_paused = true)]
async fn cache_entries_and_idempotency_records_survive_a_reload() {
    const BEFORE: &str = r#"
        [tools.weather]
        kind = "read_only"
        cache = { ttl = "5m" }

        [tools.pay]
        kind = "mutating"
    "#;
    const AFTER: &str = r#"
        [tools.weather]
        kind = "read_only"
        cache = { ttl = "10m" }
        retry = { max_attempts = 5 }

        [tools.pay]
        kind = "mutating"
        retry = { max_attempts = 4 }
        idempotency = { record_ttl = "48h" }
    "#;
    let shield = shield(BEFORE);
    let (weather_calls, pay_calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let router = shield
        .router()
        .tool("weather", counting(&weather_calls))
        .tool("pay", counting(&pay_calls))
        .build()
        .expect("router");
    let weather = || ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly);
    let pay = || {
        ToolRequest::new("pay", json!({"amount": 10}))
            .kind(CallKind::Mutating)
            .idempotency_key("order-1")
    };
    router.clone().oneshot(weather()).await.expect("weather");
    router.clone().oneshot(pay()).await.expect("pay");

    let summary = shield.reload(config(AFTER)).expect("reload");
    assert_eq!(summary.changed, ["pay", "weather"]);

    let hit = router.clone().oneshot(weather()).await.expect("weather");
    assert!(
        hit.provenance.cache_hit,
        "the entry cached before the reload"
    );
    assert_eq!(hit.output["n"], 1);
    let replay = router.clone().oneshot(pay()).await.expect("pay");
    assert!(
        replay.provenance.replayed,
        "the record made before the reload"
    );
    assert_eq!(replay.output["n"], 1);
    assert_eq!(
        (
            weather_calls.load(Ordering::SeqCst),
            pay_calls.load(Ordering::SeqCst)
        ),
        (1, 1)
    );

    // An entry keeps the expiry it was written with (5 minutes); entries written after
    // the reload get the new TTL (10 minutes).
    tokio::time::advance(Duration::from_secs(6 * 60)).await;
    let miss = router.clone().oneshot(weather()).await.expect("weather");
    assert!(
        !miss.provenance.cache_hit,
        "the old entry expired at 5 minutes"
    );
    assert_eq!(miss.output["n"], 2);
    tokio::time::advance(Duration::from_secs(8 * 60)).await;
    let hit = router.oneshot(weather()).await.expect("weather");
    assert!(hit.provenance.cache_hit, "the new entry lives 10 minutes");
    assert_eq!(hit.output["n"], 2);
}

#[tokio::test(start_paused = true)]
async fn a_reload_can_turn_the_stack_off_and_on() {
    let shield = shield(&flaky(2));
    let ledger = Ledger::default();
    let wrapped = shield.wrap(
        "flaky",
        first_attempt_fails(&ledger, Duration::from_millis(5)),
    );
    let mut off = config(&flaky(2));
    off.enabled = false;
    let summary = shield.reload(off).expect("reload");
    assert!(!summary.enabled);
    // A pass-through: no retry, the tool's own error.
    let err = wrapped
        .clone()
        .oneshot(req("flaky", 1))
        .await
        .expect_err("no retry");
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    shield.reload(config(&flaky(2))).expect("reload");
    let ok = wrapped
        .oneshot(req("flaky", 2))
        .await
        .expect("retried again");
    assert_eq!(ok.output["attempt"], 2);
}

#[tokio::test(start_paused = true)]
async fn reloads_from_many_clones_at_once_leave_one_consistent_generation() {
    let shield = shield(&flaky(1));
    let mut threads = Vec::new();
    for t in 0..4u32 {
        let shield = shield.clone();
        threads.push(std::thread::spawn(move || {
            for _ in 0..25 {
                shield.reload(config(&flaky(1 + t % 2))).expect("reload");
            }
        }));
    }
    for t in threads {
        t.join().expect("no reload panics");
    }
    assert_eq!(shield.generation(), 101);
    let ledger = Ledger::default();
    let wrapped = shield.wrap(
        "flaky",
        first_attempt_fails(&ledger, Duration::from_millis(5)),
    );
    let attempts = shield.config().tools["flaky"].retry.max_attempts;
    let result = wrapped.oneshot(req("flaky", 1)).await;
    assert_eq!(
        result.is_ok(),
        attempts == 2,
        "the stack follows the last configuration"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cache_given_and_taken_away_by_a_reload_is_in_force_at_once() {
    // Without a TTL the cache is left out of the tool's stack; a reload that gives the
    // tool one puts it in, and a reload that takes it away leaves it out again.
    const NONE: &str = r#"
        [tools.quote]
        kind = "read_only"
    "#;
    const CACHED: &str = r#"
        [tools.quote]
        kind = "read_only"
        cache = { ttl = "5m" }
    "#;
    let shield = shield(NONE);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = shield.wrap("quote", counting(&calls));
    let quote = || ToolRequest::new("quote", json!({"symbol": "ACME"})).kind(CallKind::ReadOnly);
    let call = || async { svc.clone().oneshot(quote()).await.expect("quote") };

    for n in 1..=2 {
        let res = call().await;
        assert!(!res.provenance.cache_hit, "no cache: every call runs");
        assert_eq!(res.output["n"], n);
    }

    shield.reload(config(CACHED)).expect("reload");
    assert_eq!(call().await.output["n"], 3, "a miss stores the result");
    let hit = call().await;
    assert!(
        hit.provenance.cache_hit,
        "the cache given by the reload answers"
    );
    assert_eq!(hit.output["n"], 3);

    shield.reload(config(NONE)).expect("reload");
    let res = call().await;
    assert!(
        !res.provenance.cache_hit,
        "the cache taken away answers no more"
    );
    assert_eq!(res.output["n"], 4);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn a_reload_summary_entry_named_defaults_always_means_the_defaults_section() {
    // `changed` and `breaker_settings_kept` name the defaults `defaults` and tools by
    // their names: a tool named `defaults` would make an entry mean either. The name is
    // reserved, in a file and in a configuration built in code, at build and at reload.
    let err = ShieldConfig::from_toml_str("[tools.defaults]\nretry = { max_attempts = 2 }\n")
        .expect_err("a tool named `defaults`");
    assert_eq!(problem_fields(&err), ["tools.defaults"], "{err}");
    assert!(err.to_string().contains("reserved"), "{err}");

    let shield = shield(&flaky(2));
    let mut ambiguous = config(&flaky(2));
    let mut tool = ambiguous.defaults.clone();
    tool.retry.max_attempts = 3;
    ambiguous.tools.insert("defaults".to_owned(), tool);
    let err = shield.reload(ambiguous.clone()).expect_err("refused");
    assert_eq!(problem_fields(&err), ["tools.defaults"], "{err}");
    assert_eq!(shield.generation(), 1);
    assert!(Shield::from_config(ambiguous).is_err());

    // What `defaults` in a summary means: the defaults section changed.
    let mut new_defaults = config(&flaky(2));
    new_defaults.defaults.retry.max_attempts = 5;
    let summary = shield.reload(new_defaults).expect("reload");
    assert_eq!(summary.changed, ["defaults"]);
}

/// A tool's flow-control layers are built when it is first wrapped and kept for the life
/// of the shield, and `[runs]` is read once: a reload that changes them is reported as not
/// in force, for the tools already wrapped only, never listed as if it were applied.
#[tokio::test]
async fn flow_settings_a_reload_cannot_apply_are_reported_as_kept() {
    let before = r#"
        [tools.wrapped]
        kind = "read_only"
        bulkhead = { max_concurrent = 1 }

        [tools.not_wrapped]
        kind = "read_only"
        bulkhead = { max_concurrent = 1 }

        [tools.unchanged]
        kind = "read_only"
        bulkhead = { max_concurrent = 1 }
    "#;
    let shield = shield(before);
    let calls = Arc::new(AtomicUsize::new(0));
    let (_wrapped, _unchanged) = (
        shield.wrap("wrapped", counting(&calls)),
        shield.wrap("unchanged", counting(&calls)),
    );

    // Only the timeout changes: everything reloads, nothing is kept.
    let timeout_only = before.replace(
        "[tools.wrapped]\n",
        "[tools.wrapped]\n        timeout = { attempt = \"5s\" }\n",
    );
    let summary = shield.reload(config(&timeout_only)).expect("reload");
    assert_eq!(summary.changed, vec!["wrapped".to_owned()]);
    assert!(summary.flow_settings_kept.is_empty(), "{summary:?}");
    assert!(!summary.runs_kept);

    // The bulkheads of `wrapped` and `not_wrapped` and the run budgets change.
    let flow_changed = timeout_only
        .replace(
            "bulkhead = { max_concurrent = 1 }\n\n        [tools.not_wrapped]",
            "bulkhead = { max_concurrent = 5 }\n\n        [tools.not_wrapped]",
        )
        .replace(
            "bulkhead = { max_concurrent = 1 }\n\n        [tools.unchanged]",
            "bulkhead = { max_concurrent = 5 }\n\n        [tools.unchanged]",
        )
        + "\n        [runs]\n        run_max_calls = 10\n";
    let summary = shield.reload(config(&flow_changed)).expect("reload");
    assert_eq!(
        summary.flow_settings_kept,
        vec!["wrapped".to_owned()],
        "only a wrapped tool keeps its flow layers: {summary:?}"
    );
    assert!(summary.runs_kept, "[runs] is read once: {summary:?}");
    assert!(summary.changed.contains(&"not_wrapped".to_owned()));
}
