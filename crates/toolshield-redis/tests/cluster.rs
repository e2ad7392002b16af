//! The stores on a real local Redis Cluster (three masters started by the test): the
//! contract suites, one slot per operation, redirections (`MOVED`/`ASK`) while a slot
//! migrates, a master killed without replicas (fail-closed, nothing runs twice), and a
//! failover to a replica.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{counting_tool, pay, stack};
use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolRequest};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyStore, OnStoreError};
use toolshield_redis::testing::{private_cluster, unique_prefix, ClusterOptions, RedisCluster};
use toolshield_redis::{RedisCacheStore, RedisConfig, RedisConnection, RedisIdempotencyStore};
use tower::ServiceExt;

async fn connect(cluster: &RedisCluster, op_timeout: Duration) -> RedisConnection {
    let config = RedisConfig::cluster(cluster.seeds())
        .with_key_prefix(unique_prefix())
        .with_op_timeout(op_timeout);
    match RedisConnection::connect(config).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to the test cluster: {e}"),
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(out.status.success(), "redis-cli {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stores_pass_the_contract_suites_on_a_cluster() {
    let test = "the_stores_pass_the_contract_suites_on_a_cluster";
    let Some(cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let conn = connect(&cluster, Duration::from_secs(1)).await;
    assert!(conn.is_cluster());
    toolshield_idempotency::testing::contract::run_all(|| RedisIdempotencyStore::new(conn.clone()))
        .await;
    toolshield_cache::testing::contract::run_all(|| RedisCacheStore::new(conn.clone())).await;
    let rtt = conn.health().await.expect("every master answers PING");
    assert!(rtt < conn.config().health_timeout);
    let info = conn.info("server").await.expect("info of every master");
    assert_eq!(info.matches("# node ").count(), 3, "{info}");

    // A blank tool name gives an empty hash tag: the record and its marker hash apart,
    // and the claim is refused (a store error), never half-applied.
    let store = RedisIdempotencyStore::new(conn.clone());
    let key = toolshield_idempotency::storage_key("", None, "k");
    let record = toolshield_idempotency::IdempotencyRecord::pending(
        toolshield_core::Digest::of_bytes(b"p"),
        "owner",
        Duration::from_secs(5),
    );
    let refused = store.claim(&key, record, Duration::from_secs(5)).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        store.get(&key).await.unwrap().is_none(),
        "nothing was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_and_its_lease_marker_share_one_slot_and_tools_spread_over_masters() {
    let test = "a_record_and_its_lease_marker_share_one_slot_and_tools_spread_over_masters";
    let Some(cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let conn = connect(&cluster, Duration::from_secs(1)).await;
    let prefix = conn.config().key_prefix.clone();
    let store = RedisIdempotencyStore::new(conn.clone());
    let mut masters = std::collections::BTreeSet::new();
    // Names that need escaping inside the tag, separators, non-ASCII, many tags.
    let mut tools: Vec<String> = ["pay", "a%b", "x:y", "météo", "srv__tool", "a b"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    tools.extend((0..24).map(|i| format!("tool-{i}")));
    for tool in &tools {
        let key = toolshield_core::keys::storage_key("idemp", tool, Some("caller:{x}"), "order-1");
        let record = toolshield_idempotency::IdempotencyRecord::pending(
            toolshield_core::Digest::of_bytes(b"payload"),
            format!("owner-{tool}"),
            Duration::from_secs(5),
        );
        // One script over both keys: a CROSSSLOT error here would fail the claim.
        let claimed = store
            .claim(&key, record, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("claim for tool {tool:?}: {e}"));
        assert!(matches!(
            claimed,
            toolshield_idempotency::ClaimOutcome::Claimed
        ));
        let record_key = format!("{prefix}{key}");
        let marker_key = format!("{prefix}lease:{key}");
        let slot = cluster.slot_of(&record_key).unwrap();
        assert_eq!(
            slot,
            cluster.slot_of(&marker_key).unwrap(),
            "tool {tool:?}: record and marker in different slots"
        );
        let master = cluster.master_of(&record_key).unwrap();
        // Both keys are really there, on that master.
        assert_eq!(cli(master, &["exists", &record_key, &marker_key]), "2");
        masters.insert(master);
    }
    assert_eq!(masters.len(), 3, "30 tools must spread over all 3 masters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_replay_is_one_round_trip_and_a_first_execution_two() {
    let test = "on_a_cluster_a_replay_is_one_round_trip_and_a_first_execution_two";
    let Some(cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let conn = connect(&cluster, Duration::from_secs(1)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = counting_tool(Arc::clone(&runs), "one", Duration::ZERO);
    let (svc, _) = stack(
        IdempotencyConfig::default(),
        Arc::new(RedisIdempotencyStore::new(conn.clone())),
        tool,
    );
    // Warm the script cache of every master (each answers NOSCRIPT once).
    for i in 0..30 {
        let req = ToolRequest::new(format!("warm-{i}"), json!({}))
            .kind(CallKind::Mutating)
            .idempotency_key("w");
        svc.clone().oneshot(req).await.unwrap();
    }
    let before = conn.round_trips();
    let first = svc.clone().oneshot(pay("rt-1")).await.unwrap();
    assert_eq!(conn.round_trips() - before, 2, "claim + complete");
    let before = conn.round_trips();
    let again = svc.clone().oneshot(pay("rt-1")).await.unwrap();
    assert_eq!(
        conn.round_trips() - before,
        1,
        "one claim answers the replay"
    );
    assert!(again.provenance.replayed);
    assert_eq!(first.output, again.output);
}

/// Moves `slot` from the master on `from` to the master on `to` as `redis-cli --cluster
/// reshard` does, calling `between` while the slot is MIGRATING/IMPORTING and before
/// its keys moved.
async fn migrate_slot<F: std::future::Future<Output = ()>>(
    cluster: &RedisCluster,
    slot: u16,
    from: u16,
    to: u16,
    between: F,
) {
    let from_id = cli(from, &["cluster", "myid"]);
    let to_id = cli(to, &["cluster", "myid"]);
    let s = slot.to_string();
    assert_eq!(
        cli(to, &["cluster", "setslot", &s, "importing", &from_id]),
        "OK"
    );
    assert_eq!(
        cli(from, &["cluster", "setslot", &s, "migrating", &to_id]),
        "OK"
    );
    between.await;
    loop {
        let keys = cli(from, &["cluster", "getkeysinslot", &s, "100"]);
        let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
        if keys.is_empty() {
            break;
        }
        let port = to.to_string();
        let mut args = vec![
            "migrate",
            "127.0.0.1",
            port.as_str(),
            "",
            "0",
            "5000",
            "keys",
        ];
        args.extend(keys);
        assert_eq!(cli(from, &args), "OK");
    }
    for port in cluster.ports() {
        cli(port, &["cluster", "setslot", &s, "node", &to_id]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_that_moves_mid_run_is_followed_through_ask_and_moved_without_a_second_run() {
    let test = "a_slot_that_moves_mid_run_is_followed_through_ask_and_moved_without_a_second_run";
    let Some(cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let conn = connect(&cluster, Duration::from_secs(1)).await;
    let prefix = conn.config().key_prefix.clone();
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = counting_tool(Arc::clone(&runs), "one", Duration::ZERO);
    let (svc, handle) = stack(
        IdempotencyConfig::default(),
        Arc::new(RedisIdempotencyStore::new(conn.clone())),
        tool,
    );
    let before = svc.clone().oneshot(pay("before-move")).await.unwrap();
    let key = toolshield_idempotency::storage_key("pay", None, "before-move");
    let record_key = format!("{prefix}{key}");
    let slot = cluster.slot_of(&record_key).unwrap();
    let from = cluster.master_of(&record_key).unwrap();
    let to = *cluster.ports().iter().find(|p| **p != from).unwrap();

    // While the slot migrates, a key of the same tool (same slot) that is not on the
    // source yet is sent to the target (ASK); the target cannot run a two-key script on
    // keys it does not hold yet (TRYAGAIN) until the slot is settled, and the client
    // retries within the operation timeout; then the slot has moved (MOVED).
    let during = svc.clone();
    let started = Arc::new(std::sync::Mutex::new(None));
    let task = Arc::clone(&started);
    migrate_slot(&cluster, slot, from, to, async move {
        *task.lock().unwrap() = Some(tokio::spawn(during.oneshot(pay("during-move"))));
        tokio::time::sleep(Duration::from_millis(150)).await;
    })
    .await;
    let call = started
        .lock()
        .unwrap()
        .take()
        .expect("the call during the move");
    let during_move = call
        .await
        .unwrap()
        .expect("a call made while its slot migrates succeeds once the slot is settled");
    let during_key = format!(
        "{prefix}{}",
        toolshield_idempotency::storage_key("pay", None, "during-move")
    );
    // Written on the target.
    assert_eq!(cli(to, &["exists", &during_key]), "1");

    // The client's slot map is stale: the source answers MOVED, the client follows.
    let replay = svc.clone().oneshot(pay("before-move")).await.unwrap();
    assert!(replay.provenance.replayed, "the record moved with its slot");
    assert_eq!(replay.output, before.output);
    let replay = svc.clone().oneshot(pay("during-move")).await.unwrap();
    assert!(replay.provenance.replayed);
    assert_eq!(replay.output, during_move.output);
    assert_eq!(cluster.master_of(&record_key).unwrap(), to);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each key ran once");
    assert_eq!(handle.counts().executions, 2);
}

/// A tool name whose records live on the master on `port`, and one whose records live
/// elsewhere.
fn tools_on(cluster: &RedisCluster, prefix: &str, port: u16) -> (String, String) {
    let mut on = None;
    let mut off = None;
    for i in 0..200 {
        let tool = format!("tool-{i}");
        let key = format!(
            "{prefix}{}",
            toolshield_idempotency::storage_key(&tool, None, "k")
        );
        if cluster.master_of(&key).unwrap() == port {
            on.get_or_insert(tool);
        } else {
            off.get_or_insert(tool);
        }
        if let (Some(a), Some(b)) = (&on, &off) {
            return (a.clone(), b.clone());
        }
    }
    panic!("no tool maps to the master on port {port}");
}

fn mutation(tool: &str, key: &str) -> ToolRequest {
    ToolRequest::new(tool, json!({"amount": 1}))
        .kind(CallKind::Mutating)
        .idempotency_key(key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_without_replicas_fails_closed_for_its_keys_only_and_runs_nothing_twice() {
    let test =
        "a_master_killed_without_replicas_fails_closed_for_its_keys_only_and_runs_nothing_twice";
    let Some(mut cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let op_timeout = Duration::from_millis(300);
    let conn = connect(&cluster, op_timeout).await;
    let prefix = conn.config().key_prefix.clone();
    let victim = cluster.ports()[0];
    let (lost_tool, kept_tool) = tools_on(&cluster, &prefix, victim);
    let runs = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(RedisIdempotencyStore::new(conn.clone()));
    let tool = counting_tool(Arc::clone(&runs), "closed", Duration::ZERO);
    let (closed, closed_handle) = stack(IdempotencyConfig::default(), store.clone(), tool);
    let open_runs = Arc::new(AtomicUsize::new(0));
    let tool = counting_tool(Arc::clone(&open_runs), "open", Duration::ZERO);
    let open_cfg = IdempotencyConfig {
        on_store_error: OnStoreError::FailOpen,
        ..IdempotencyConfig::default()
    };
    let (open, open_handle) = stack(open_cfg, store, tool);

    closed
        .clone()
        .oneshot(mutation(&lost_tool, "a"))
        .await
        .unwrap();
    closed
        .clone()
        .oneshot(mutation(&kept_tool, "a"))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    cluster.kill_node(victim);

    // Right after the kill and again once the others marked the node failed (1 s node
    // timeout): the dead master's keys fail closed within the operation timeout, and the
    // other masters keep serving theirs.
    for round in 0..2 {
        for key in ["a", "b"] {
            let started = std::time::Instant::now();
            let err = closed
                .clone()
                .oneshot(mutation(&lost_tool, key))
                .await
                .expect_err("the dead master's slot is unavailable");
            assert_eq!(
                err.kind(),
                ErrorKind::StoreUnavailable,
                "round {round}: {err}"
            );
            assert!(
                started.elapsed() < op_timeout * 3,
                "round {round}: a store error must come within the operation timeout, took {:?}",
                started.elapsed()
            );
        }
        let replay = closed
            .clone()
            .oneshot(mutation(&kept_tool, "a"))
            .await
            .unwrap();
        assert!(replay.provenance.replayed, "round {round}");
        let fresh = closed
            .clone()
            .oneshot(mutation(&kept_tool, &format!("fresh-{round}")))
            .await
            .unwrap();
        assert!(!fresh.provenance.replayed);
        if round == 0 {
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
    }
    // Fail-closed never ran the tool for the dead master's keys: once per key in all.
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "a, a on the kept tool, fresh-0, fresh-1"
    );
    assert!(closed_handle.counts().store_errors >= 4);

    // Fail-open runs the tool without dedupe (by choice), and counts it.
    open.clone()
        .oneshot(mutation(&lost_tool, "c"))
        .await
        .unwrap();
    assert_eq!(open_runs.load(Ordering::SeqCst), 1);
    assert!(open_handle.counts().store_errors >= 1);

    // The cache treats the dead master's slot as a miss.
    let cache = RedisCacheStore::new(conn.clone());
    let key =
        toolshield_cache::storage_key(&lost_tool, None, &toolshield_core::Digest::of_bytes(b"x"));
    assert!(toolshield_cache::CacheStore::get(&cache, &key)
        .await
        .is_err());
    // Health reports the cluster unhealthy: one master does not answer.
    assert!(conn.health().await.is_err());
}

/// Waits until the replica of the master on `master` holds `key` (asked of the replica
/// itself), is online, and has applied every write the master took, three times in a
/// row: equal offsets alone do not show that the replica's data set holds the key.
fn wait_replica_holds(master: u16, key: &str, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    let mut settled = 0;
    loop {
        let info = cli(master, &["info", "replication"]);
        let offset = info
            .lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .map(str::trim);
        let replica = info.lines().find(|l| l.starts_with("slave0:"));
        let field = |name: &str| {
            replica.and_then(|l| {
                l.split(',')
                    .find_map(|f| f.strip_prefix(name))
                    .map(str::trim)
            })
        };
        let port = field("port=").and_then(|p| p.parse::<u16>().ok());
        let holds = port.is_some_and(|p| cli(p, &["keys", key]).trim() == key);
        if holds
            && field("state=") == Some("online")
            && offset.is_some()
            && offset == field("offset=")
        {
            settled += 1;
            if settled == 3 {
                return;
            }
        } else {
            settled = 0;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replica of {master} does not hold {key}: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_to_a_replica_the_records_replay_and_new_calls_run() {
    let test = "after_a_failover_to_a_replica_the_records_replay_and_new_calls_run";
    let options = ClusterOptions {
        replicas_per_master: 1,
        ..ClusterOptions::default()
    };
    let Some(mut cluster) = private_cluster(test, options) else {
        return;
    };
    let conn = connect(&cluster, Duration::from_millis(300)).await;
    let prefix = conn.config().key_prefix.clone();
    let probe = format!(
        "{prefix}{}",
        toolshield_idempotency::storage_key("pay", None, "k")
    );
    let victim = cluster.master_of(&probe).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = counting_tool(Arc::clone(&runs), "one", Duration::ZERO);
    let (svc, _) = stack(
        IdempotencyConfig::default(),
        Arc::new(RedisIdempotencyStore::new(conn.clone())),
        tool,
    );
    let first = svc.clone().oneshot(pay("before-failover")).await.unwrap();
    let record = format!(
        "{prefix}{}",
        toolshield_idempotency::storage_key("pay", None, "before-failover")
    );
    wait_replica_holds(victim, &record, Duration::from_secs(10));

    cluster.kill_node(victim);
    // Until the replica is promoted the slot is unavailable: fail-closed, nothing runs.
    let mut unavailable = 0;
    let started = std::time::Instant::now();
    let replay = loop {
        match svc.clone().oneshot(pay("before-failover")).await {
            Ok(r) => break r,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::StoreUnavailable, "{e}");
                unavailable += 1;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no failover within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    cluster
        .wait_failover(victim, Duration::from_secs(10))
        .unwrap();
    assert!(unavailable > 0, "the slot was unavailable for a while");
    assert!(
        replay.provenance.replayed,
        "the promoted replica replays the record: {} runs, {unavailable} calls refused, {:?}",
        runs.load(Ordering::SeqCst),
        replay.provenance
    );
    assert_eq!(replay.output, first.output);
    assert_ne!(cluster.master_of(&probe).unwrap(), victim);
    svc.clone().oneshot(pay("after-failover")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each key ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_openings_reach_a_process_subscribed_on_another_node_even_after_that_node_dies() {
    use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry};
    use toolshield_core::{ToolError, ToolResponse};
    use toolshield_redis::SharedBreakerState;
    use tower::Layer as _;

    let test =
        "breaker_openings_reach_a_process_subscribed_on_another_node_even_after_that_node_dies";
    let Some(mut cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let prefix = unique_prefix();
    let hash_master = cluster
        .master_of(&format!("{prefix}breaker:{{fleet}}"))
        .unwrap();
    // B subscribes first on a node that does not hold the hash (seeds in that order),
    // then on the hash's master when that node is gone.
    let ports = cluster.ports();
    let b_node = *ports.iter().find(|p| **p != hash_master).unwrap();
    let url = |p: u16| format!("redis://127.0.0.1:{p}");
    let conn = |seeds: Vec<String>| {
        RedisConnection::connect(
            RedisConfig::cluster(seeds)
                .with_key_prefix(prefix.clone())
                .with_op_timeout(Duration::from_secs(1)),
        )
    };
    let conn_a = conn(cluster.seeds()).await.unwrap();
    let conn_b = conn(vec![url(b_node), url(hash_master)]).await.unwrap();
    let open_wait = Duration::from_millis(600);
    let registry = || {
        BreakerRegistry::new(BreakerConfig {
            consecutive_failures: 2,
            open_wait,
            ..BreakerConfig::default()
        })
        .unwrap()
    };
    let (reg_a, reg_b) = (registry(), registry());
    let _shared_a = SharedBreakerState::attach(&reg_a, conn_a, "fleet")
        .await
        .unwrap();
    let shared_b = SharedBreakerState::attach(&reg_b, conn_b, "fleet")
        .await
        .unwrap();
    let failing =
        BreakerLayer::new(reg_a.clone()).layer(tower::service_fn(|_r: ToolRequest| async {
            Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
        }));
    let req = || ToolRequest::new("payments", json!({}));
    let trip = || async {
        for _ in 0..2 {
            let _ = failing.clone().oneshot(req()).await;
        }
    };
    let seen = |within: Duration| {
        let shared_b = &shared_b;
        async move {
            let deadline = tokio::time::Instant::now() + within;
            while shared_b.open_elsewhere("payments").is_none() {
                if tokio::time::Instant::now() > deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            true
        }
    };
    trip().await;
    assert!(
        seen(Duration::from_secs(2)).await,
        "published on one node, heard on another"
    );

    cluster.kill_node(b_node);
    // After the open period the half-open probe fails and A opens again.
    tokio::time::sleep(open_wait + Duration::from_millis(100)).await;
    assert!(
        shared_b.open_elsewhere("payments").is_none(),
        "the first period ended"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        let _ = failing.clone().oneshot(req()).await;
        if seen(Duration::from_millis(300)).await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "B never resubscribed on the surviving seed"
        );
        tokio::time::sleep(open_wait).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_braces_colons_or_line_breaks_keep_one_slot_and_their_own_records_and_10_kb_ones_are_refused(
) {
    let test = "names_with_braces_colons_or_line_breaks_keep_one_slot_and_their_own_records_and_10_kb_ones_are_refused";
    let Some(cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let conn = connect(&cluster, Duration::from_secs(1)).await;
    let prefix = conn.config().key_prefix.clone();
    let long = "x".repeat(10 * 1024);
    let long_braced = format!("{{{}}}", "y".repeat(10 * 1024));
    // Within every bound (tool name, caller, key): accepted.
    let braced_at_bound = format!("{{{}}}", "z".repeat(200));
    let names: Vec<&str> = vec![
        "{",
        "}",
        "}{",
        "{pay}",
        "a{b}c",
        "pay}:s5:alice:g:k",
        "line\nbreak",
        "\r\n{\n}\n",
        ":",
        &long,
        &long_braced,
        &braced_at_bound,
    ];
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = service_fn_echo(Arc::clone(&runs));
    let (svc, _) = stack(
        IdempotencyConfig::default(),
        Arc::new(RedisIdempotencyStore::new(conn.clone())),
        tool,
    );
    // Every name as the tool, as the caller and as the key, each call distinct.
    let mut calls = Vec::new();
    for (i, name) in names.iter().enumerate() {
        calls.push((name.to_string(), format!("caller-{i}"), format!("key-{i}")));
        calls.push((format!("tool-{i}"), name.to_string(), format!("key-{i}")));
        calls.push((format!("tool-{i}"), format!("caller-{i}"), name.to_string()));
    }
    for (n, (tool, caller, key)) in calls.iter().enumerate() {
        let req = || {
            ToolRequest::new(tool.as_str(), json!({"n": n}))
                .kind(CallKind::Mutating)
                .caller(caller.as_str())
                .idempotency_key(key.as_str())
        };
        if too_long(tool, caller, key) {
            // A key, a caller and a tool name each have a bound: refused, nothing runs.
            let refused = svc
                .clone()
                .oneshot(req())
                .await
                .expect_err("too long a name");
            assert_eq!(
                refused.kind(),
                ErrorKind::InvalidInput,
                "call {n}: {refused}"
            );
            continue;
        }
        let first = svc.clone().oneshot(req()).await.unwrap_or_else(|e| {
            let short = |s: &str| s.chars().take(20).collect::<String>();
            panic!(
                "call {n} ({:?}, {:?}, {:?}): {e}",
                short(tool),
                short(caller),
                short(key)
            )
        });
        assert_eq!(first.output, json!({"n": n}), "call {n}: its own answer");
        let again = svc.clone().oneshot(req()).await.expect("the duplicate");
        assert!(again.provenance.replayed, "call {n}: the duplicate replays");
        assert_eq!(
            again.output,
            json!({"n": n}),
            "call {n}: replays its own record"
        );

        let record = toolshield_idempotency::storage_key(tool, Some(caller.as_str()), key);
        let record_key = format!("{prefix}{record}");
        let marker_key = format!("{prefix}lease:{record}");
        assert_eq!(
            cluster.slot_of(&record_key).unwrap(),
            cluster.slot_of(&marker_key).unwrap(),
            "call {n}: record and marker in one slot"
        );
    }
    let admitted = calls
        .iter()
        .filter(|(tool, caller, key)| !too_long(tool, caller, key))
        .count();
    assert!(admitted < calls.len() && admitted > 0);
    assert_eq!(runs.load(Ordering::SeqCst), admitted, "each call ran once");
}

/// Whether a call names a tool, a caller or a key past its bound.
fn too_long(tool: &str, caller: &str, key: &str) -> bool {
    tool.len() > toolshield_core::keys::MAX_TOOL_NAME_LEN
        || caller.len() > toolshield_idempotency::MAX_CALLER_LEN
        || key.len() > toolshield_idempotency::MAX_KEY_LEN
}

/// A tool that counts its runs and answers with its payload.
fn service_fn_echo(
    runs: Arc<AtomicUsize>,
) -> impl tower::Service<
    ToolRequest,
    Response = toolshield_core::ToolResponse,
    Error = toolshield_core::ToolError,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |req: ToolRequest| {
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, toolshield_core::ToolError>(toolshield_core::ToolResponse::new(
                req.payload().clone(),
            ))
        }
    })
}
