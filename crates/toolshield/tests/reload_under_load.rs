//! `Shield::reload` while calls run (docs/reload.md): a call runs under one generation's
//! settings from start to end, never a mix of two; reloads racing each other apply one
//! whole configuration each; state that must survive a reload (breaker overrides, a
//! tool's old registry, bulkhead occupancy) does; a removed tool's call in flight ends
//! under its section; a kind changed under a call in flight makes no duplicate share its
//! result; and the checks the shield makes when it is built hold for a reload too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield::shield::{Shield, ToolRouter};
use toolshield_breaker::CircuitState;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse, ToolService};
use tower::{service_fn, ServiceExt};

fn config(toml: &str) -> ShieldConfig {
    ShieldConfig::from_toml_str(toml).unwrap_or_else(|e| panic!("config: {e}"))
}

fn shield(toml: &str) -> Shield {
    Shield::from_config(config(toml)).expect("shield")
}

/// Attempts seen per call id (`{"i": id}`).
type Attempts = Arc<Mutex<HashMap<u64, u32>>>;

/// A tool whose every attempt takes `delay` and then succeeds, counting attempts per id.
fn slow_tool(attempts: &Attempts, delay: Duration) -> impl ToolService {
    let attempts = Arc::clone(attempts);
    service_fn(move |req: ToolRequest| {
        let id = req.payload()["i"].as_u64().unwrap_or(u64::MAX);
        *attempts.lock().expect("attempts").entry(id).or_insert(0) += 1;
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, ToolError>(ToolResponse::new(json!({ "i": id })))
        }
    })
}

fn req(tool: &str, i: u64) -> ToolRequest {
    ToolRequest::new(tool, json!({ "i": i })).kind(CallKind::ReadOnly)
}

fn read_tool(attempts: u32, attempt_timeout: &str) -> String {
    format!(
        r#"
        [tools.t]
        kind = "read_only"
        timeout = {{ attempt = "{attempt_timeout}" }}
        retry = {{ max_attempts = {attempts}, backoff = {{ strategy = "none" }}, budget = {{ enabled = false }} }}
        breaker = {{ consecutive_failures = 0, window = {{ type = "count", size = 100000 }}, min_calls = 100000 }}
        "#
    )
}

/// Generation 1: attempts cut at 100 ms, three of them. Generation 2: one attempt of up to
/// 1 s. Every attempt takes 300 ms. A call under generation 1 ends TIMEOUT after three
/// attempts; under generation 2 it succeeds in one. A call that mixed the two would end
/// TIMEOUT after one attempt (the old timeout with the new count) or succeed after more
/// than one (the new timeout after an old retry): neither may happen.
#[tokio::test(start_paused = true)]
async fn a_call_in_flight_keeps_the_attempt_timeout_and_the_retry_count_of_one_generation() {
    let shield = shield(&read_tool(3, "100ms"));
    let attempts = Attempts::default();
    let router = shield
        .router()
        .tool("t", slow_tool(&attempts, Duration::from_millis(300)))
        .build()
        .expect("router");

    let mut calls = Vec::new();
    for i in 0..200u64 {
        if i == 100 {
            // The calls started so far are inside their first or second attempt.
            let summary = shield.reload(config(&read_tool(1, "1s"))).expect("reload");
            assert_eq!(summary.generation, 2);
        }
        let (shield, router) = (shield.clone(), router.clone());
        calls.push(tokio::spawn(async move {
            let generation = shield.generation();
            (generation, router.oneshot(req("t", i)).await)
        }));
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    let mut per_generation = [0, 0];
    for (i, call) in calls.into_iter().enumerate() {
        let (generation, result) = call.await.expect("no call panics");
        let n = attempts.lock().expect("attempts")[&(i as u64)];
        match generation {
            1 => {
                let err = result.expect_err("generation 1 always times out");
                assert_eq!(err.kind(), ErrorKind::Timeout, "call {i}");
                assert_eq!(n, 3, "call {i} keeps the three attempts it started with");
            }
            2 => {
                result.unwrap_or_else(|e| panic!("call {i} under generation 2: {e}"));
                assert_eq!(n, 1, "call {i}");
            }
            g => panic!("generation {g}"),
        }
        per_generation[generation as usize - 1] += 1;
    }
    assert_eq!(per_generation, [100, 100]);
}

/// Two reloads from two tasks on two worker threads, many times over: each applied
/// reload adds exactly one to the generation, the configuration in force is one of the
/// two whole, and a call afterwards behaves as that one says (retry count and attempt
/// timeout from the same document).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_reloads_each_add_one_generation_and_leave_one_whole_configuration() {
    let a = config(&read_tool(3, "7s"));
    let b = config(&read_tool(1, "9s"));
    let shield = shield(&read_tool(2, "5s"));
    for round in 0..50u64 {
        let before = shield.generation();
        let (sa, sb) = (shield.clone(), shield.clone());
        let (ca, cb) = (a.clone(), b.clone());
        let ta = tokio::spawn(async move { sa.reload(ca).expect("reload a").generation });
        let tb = tokio::spawn(async move { sb.reload(cb).expect("reload b").generation });
        let (ga, gb) = (ta.await.expect("task a"), tb.await.expect("task b"));
        let mut got = [ga, gb];
        got.sort_unstable();
        assert_eq!(got, [before + 1, before + 2], "round {round}");
        assert_eq!(shield.generation(), before + 2);

        let last = if ga > gb { &a } else { &b };
        let now = shield.config();
        assert_eq!(
            *now, *last,
            "round {round}: the later reload's configuration, whole"
        );
        let t = &now.tools["t"];
        assert!(
            (t.retry.max_attempts, t.timeout.attempt) == (3, Duration::from_secs(7))
                || (t.retry.max_attempts, t.timeout.attempt) == (1, Duration::from_secs(9)),
            "round {round}: a mix {:?}",
            (t.retry.max_attempts, t.timeout.attempt)
        );
    }
}

fn always_failing(calls: &Arc<AtomicUsize>) -> impl ToolService {
    let calls = Arc::clone(calls);
    service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down")) }
    })
}

fn ok_tool(calls: &Arc<AtomicUsize>) -> impl ToolService {
    let calls = Arc::clone(calls);
    service_fn(move |_req: ToolRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, ToolError>(ToolResponse::new(json!({}))) }
    })
}

async fn call_kind(router: &ToolRouter, tool: &str) -> Result<ToolResponse, ErrorKind> {
    router
        .clone()
        .oneshot(ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly))
        .await
        .map_err(|e| e.kind())
}

/// An operator forces a breaker open (or to metrics-only), then reloads: the override
/// survives a change of the tool's section; the tool whose section is removed runs on the
/// defaults' registry meanwhile, and gets its own registry, override included, back when
/// its section returns.
#[tokio::test(start_paused = true)]
async fn breaker_overrides_survive_reloads_and_a_section_that_returns_gets_its_registry_back() {
    let base = r#"
        [tools.pay]
        kind = "read_only"
        retry = { max_attempts = 1 }
        breaker = { consecutive_failures = 3 }

        [tools.search]
        kind = "read_only"
        retry = { max_attempts = 1 }
    "#;
    let shield = shield(base);
    let (pay_calls, search_calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let router = shield
        .router()
        .tool("pay", ok_tool(&pay_calls))
        .tool("search", always_failing(&search_calls))
        .build()
        .expect("router");
    shield.breaker_for("pay").force_open("pay");
    shield.breaker_for("search").metrics_only("search");

    // Both sections change (a timeout): the overrides stay.
    let changed = base.replace(
        "retry = { max_attempts = 1 }",
        "retry = { max_attempts = 1 }\n        timeout = { attempt = \"3s\" }",
    );
    let summary = shield.reload(config(&changed)).expect("reload");
    assert_eq!(summary.changed, ["pay", "search"]);
    assert_eq!(
        call_kind(&router, "pay").await.err(),
        Some(ErrorKind::CircuitOpen)
    );
    assert_eq!(pay_calls.load(Ordering::SeqCst), 0);
    // Metrics-only: failures are recorded, never rejected.
    for _ in 0..10 {
        assert_eq!(
            call_kind(&router, "search").await.err(),
            Some(ErrorKind::UpstreamUnavailable)
        );
    }
    assert_eq!(search_calls.load(Ordering::SeqCst), 10);
    assert_eq!(
        shield.breaker_for("search").state("search"),
        CircuitState::MetricsOnly
    );

    // `pay` loses its section: it runs on the defaults, in the default registry, where
    // nothing forced it open.
    let summary = shield
        .reload(config(
            "[tools.search]\nkind = \"read_only\"\nretry = { max_attempts = 1 }\n",
        ))
        .expect("reload");
    assert_eq!(summary.removed, ["pay"]);
    assert!(
        shield.breakers().contains_key("pay"),
        "its registry is kept"
    );
    assert!(call_kind(&router, "pay").await.is_ok());
    assert_eq!(pay_calls.load(Ordering::SeqCst), 1);

    // Its section returns: its own registry, still forced open.
    let summary = shield.reload(config(base)).expect("reload");
    assert_eq!(summary.added, ["pay"]);
    assert!(summary.new_registries.is_empty(), "{summary:?}");
    assert_eq!(
        call_kind(&router, "pay").await.err(),
        Some(ErrorKind::CircuitOpen)
    );
    assert_eq!(pay_calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        shield.breaker_for("pay").state("pay"),
        CircuitState::ForcedOpen
    );
}

/// A bulkhead of one whose slot is held by a call in flight: a reload (whatever it
/// changes, the bulkhead included) must not give the next call a second, empty bulkhead.
#[tokio::test(start_paused = true)]
async fn a_reload_does_not_empty_a_full_bulkhead() {
    let before = r#"
        [tools.t]
        kind = "read_only"
        retry = { max_attempts = 1 }
        bulkhead = { max_concurrent = 1, max_queue = 0 }
    "#;
    let shield = shield(before);
    let attempts = Attempts::default();
    let router = shield
        .router()
        .tool("t", slow_tool(&attempts, Duration::from_secs(5)))
        .build()
        .expect("router");
    let holder = tokio::spawn(router.clone().oneshot(req("t", 0)));
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_eq!(
        attempts.lock().expect("attempts").len(),
        1,
        "the slot is held"
    );

    for after in [
        before.replace(
            "max_attempts = 1",
            "max_attempts = 1, rate_limit_backoff = \"1s\"",
        ),
        before.replace("max_concurrent = 1", "max_concurrent = 2"),
    ] {
        shield.reload(config(&after)).expect("reload");
        let err = router
            .clone()
            .oneshot(req("t", 1))
            .await
            .expect_err("the bulkhead is still full");
        assert_eq!(err.kind(), ErrorKind::Overloaded);
    }
    assert_eq!(attempts.lock().expect("attempts").len(), 1);
    holder
        .await
        .expect("holder")
        .expect("the call in flight succeeds");
    router
        .clone()
        .oneshot(req("t", 2))
        .await
        .expect("the slot is free again");
}

/// A reload that removes a tool's section while its calls run: those calls finish under
/// the section (two attempts), the next call runs on the defaults (three).
#[tokio::test(start_paused = true)]
async fn a_removed_tools_calls_in_flight_finish_under_its_section() {
    let shield = shield(&read_tool(2, "100ms"));
    let attempts = Attempts::default();
    let router = shield
        .router()
        .tool("t", slow_tool(&attempts, Duration::from_millis(300)))
        .build()
        .expect("router");
    let in_flight: Vec<_> = (0..10)
        .map(|i| tokio::spawn(router.clone().oneshot(req("t", i))))
        .collect();
    tokio::time::advance(Duration::from_millis(50)).await;
    let summary = shield
        .reload(config(
            "[defaults]\nkind = \"read_only\"\ntimeout = { attempt = \"100ms\" }\n\
             retry = { max_attempts = 3, backoff = { strategy = \"none\" }, budget = { enabled = false } }\n",
        ))
        .expect("reload");
    assert_eq!(summary.removed, ["t"]);
    for call in in_flight {
        let err = call.await.expect("task").expect_err("times out");
        assert_eq!(err.kind(), ErrorKind::Timeout);
    }
    let after = router
        .clone()
        .oneshot(req("t", 99))
        .await
        .expect_err("times out");
    assert_eq!(after.kind(), ErrorKind::Timeout);
    let attempts = attempts.lock().expect("attempts");
    for i in 0..10 {
        assert_eq!(attempts[&i], 2, "call {i} started under the section");
    }
    assert_eq!(
        attempts[&99], 3,
        "the call after the reload runs on the defaults"
    );
}

/// A tool turned from `read_only` (cached, single-flight) to `mutating` while a read of
/// it runs: the same call made after the reload is a mutation and runs on its own, never
/// handed the result of the read in flight, and never served later from its cache entry.
#[tokio::test(start_paused = true)]
async fn a_call_after_a_tool_becomes_mutating_never_shares_the_result_of_a_read_in_flight() {
    let shield = shield(
        "[tools.t]\nkind = \"read_only\"\ncache = { ttl = \"1h\" }\nretry = { max_attempts = 1 }\n",
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = {
        let runs = Arc::clone(&runs);
        service_fn(move |req: ToolRequest| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let kind = format!("{:?}", req.call_kind());
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, ToolError>(ToolResponse::new(json!({ "run": n, "kind": kind })))
            }
        })
    };
    let router = shield.router().tool("t", tool).build().expect("router");
    let same = || ToolRequest::new("t", json!({ "to": "alice" }));
    let read = tokio::spawn(router.clone().oneshot(same()));
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    shield
        .reload(config(
            "[tools.t]\nkind = \"mutating\"\nretry = { max_attempts = 1 }\n",
        ))
        .expect("reload");
    let write = tokio::spawn(router.clone().oneshot(same()));
    let read = read.await.expect("task").expect("the read succeeds");
    let write = write.await.expect("task").expect("the write succeeds");
    assert_eq!(read.output["run"], 1);
    assert_eq!(write.output["run"], 2, "the mutation ran itself");
    assert_eq!(write.output["kind"], "Mutating");
    // The mutation's duplicate is deduplicated (replayed), not served the read's entry.
    let again = router.clone().oneshot(same()).await.expect("replay");
    assert_eq!(again.output["run"], 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// What `Shield::from_config` refuses (docs/configuration.md, "When the shield is
/// built": more than 1000 tools, a duration over 366 days) a reload refuses too, with the
/// running configuration and generation untouched; a configuration within the bounds
/// reloads.
#[tokio::test(start_paused = true)]
async fn a_reload_refuses_what_building_the_shield_refuses_and_changes_nothing() {
    let many = |n: usize| {
        (0..n)
            .map(|i| format!("[tools.t{i}]\nkind = \"read_only\"\n"))
            .collect::<String>()
    };
    // Parsing refuses a 367-day duration already; a configuration built in code is
    // checked by `validate` alone.
    let mut too_long = config("[tools.t]\nkind = \"read_only\"\ncache = { ttl = \"1h\" }\n");
    if let Some(t) = too_long.tools.get_mut("t") {
        t.cache.ttl = Duration::from_secs(367 * 24 * 3600);
    }
    for (what, cfg) in [
        ("1001 tools", config(&many(1001))),
        ("a 367-day TTL", too_long),
    ] {
        assert!(
            Shield::from_config(cfg.clone()).is_err(),
            "{what}: building refuses it"
        );
        let shield = shield(&read_tool(2, "1s"));
        let err = shield.reload(cfg).expect_err(what);
        assert!(!err.problems().is_empty(), "{what}: {err}");
        assert_eq!(shield.generation(), 1, "{what}");
        assert_eq!(shield.tool_names(), ["t"], "{what}");
    }
    let shield = shield(&read_tool(2, "1s"));
    let summary = shield.reload(config(&many(1000))).expect("1000 tools");
    assert_eq!(summary.added.len(), 1000);
    assert_eq!(summary.removed, ["t"]);
}

/// A configuration refused for durations over the longest accepted (a reload's body, or
/// one built in code) names each problem once: an operator fixing the list must not see
/// the same line twice.
#[tokio::test(start_paused = true)]
async fn a_refused_reload_lists_each_problem_once() {
    let text = r#"
        [tools.t]
        kind = "read_only"
        cache = { ttl = "367days", stale_if_error = "400days" }
    "#;
    let err = ShieldConfig::from_toml_str(text).expect_err("durations over 366 days");
    let mut fields = toolshield_test::problem_fields(&err);
    fields.sort_unstable();
    assert_eq!(
        fields,
        ["tools.t.cache.stale_if_error", "tools.t.cache.ttl"],
        "{err}"
    );

    let mut cfg = config("[tools.t]\nkind = \"read_only\"\ncache = { ttl = \"1h\" }\n");
    if let Some(t) = cfg.tools.get_mut("t") {
        t.cache.ttl = Duration::from_secs(367 * 24 * 3600);
    }
    let shield = shield("");
    let err = shield.reload(cfg).expect_err("a 367-day TTL");
    assert_eq!(
        toolshield_test::problem_fields(&err),
        ["tools.t.cache.ttl"],
        "{err}"
    );
    assert_eq!(shield.generation(), 1);
}
