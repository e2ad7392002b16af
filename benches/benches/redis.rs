//! The Redis idempotency path: round trips per first execution and per replay; calls per
//! second and p99 latency at 1, 16 and 256 concurrent callers on one node and on a local
//! three-master Redis Cluster, each next to `redis-benchmark -t set` at the same
//! concurrency against the same server in the same run; and the cost per call of the
//! shared breaker open-state, closed and open.
//!
//! Runs against `TOOLSHIELD_REDIS_URL` when set, else a private `redis-server` on a free
//! loopback port (and a private cluster); skips (printing why) when neither is possible.
//! `TOOLSHIELD_BENCH_SECS` sets the length of each throughput run (default 1.5 s).

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use serde_json::json;
use toolshield_benches::BareTool;
use toolshield_core::{CallKind, ToolRequest};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer};
use toolshield_redis::testing::{unique_prefix, RedisCluster, RedisServer};
use toolshield_redis::{RedisConfig, RedisConnection, RedisIdempotencyStore};
use tower::{Layer, Service, ServiceExt};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The server under test: (url, port for redis-benchmark, the private server if any).
fn server() -> Option<(String, Option<RedisServer>)> {
    if let Ok(url) = std::env::var("TOOLSHIELD_REDIS_URL") {
        if !url.is_empty() {
            return Some((url, None));
        }
    }
    match RedisServer::start() {
        Ok(s) => Some((s.url(), Some(s))),
        Err(e) => {
            eprintln!("SKIPPED the redis bench: no redis-server could be started ({e})");
            None
        }
    }
}

static KEY: AtomicU64 = AtomicU64::new(0);

fn pay(key: &str) -> ToolRequest {
    ToolRequest::new("pay", json!({"amount": 42, "currency": "EUR"}))
        .kind(CallKind::Mutating)
        .idempotency_key(key)
}

fn fresh() -> ToolRequest {
    pay(&format!("k{}", KEY.fetch_add(1, Ordering::Relaxed)))
}

/// `INFO commandstats` as (command, calls) pairs.
async fn commandstats(conn: &RedisConnection) -> Vec<(String, u64)> {
    let info = conn.info("commandstats").await.unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let l = l.strip_prefix("cmdstat_")?;
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

fn delta(before: &[(String, u64)], after: &[(String, u64)]) -> String {
    let mut out = Vec::new();
    for (name, calls) in after {
        let was = before
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, c)| *c);
        if *calls > was && name != "info" {
            out.push(format!("{name}={}", calls - was));
        }
    }
    out.join(" ")
}

/// Tools the throughput runs spread their keys over: one hash tag each, so on a cluster
/// the keys land on every master, as a fleet of tools would.
const TOOLS: u64 = 16;

fn spread(n: u64) -> ToolRequest {
    ToolRequest::new(
        format!("pay-{}", n % TOOLS),
        json!({"amount": 42, "currency": "EUR"}),
    )
    .kind(CallKind::Mutating)
    .idempotency_key(format!("s{n}"))
}

/// `redis-benchmark -t set -c clients -n n -q --csv` (with `--cluster` for a cluster):
/// (requests/s, p99 ms).
fn redis_benchmark(port: u16, clients: u64, cluster: bool) -> Option<(f64, f64)> {
    let n = if clients == 1 { 30_000 } else { 100_000 };
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-p", &port.to_string(), "-t", "set", "-q", "--csv"])
        .args(["-c", &clients.to_string(), "-n", &n.to_string()]);
    if cluster {
        cmd.arg("--cluster");
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => {
            println!("  redis-benchmark not run: {e}");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = text.lines().find(|l| l.starts_with("\"SET\""))?;
    let f: Vec<f64> = row
        .split(',')
        .skip(1)
        .filter_map(|v| v.trim_matches('"').parse().ok())
        .collect();
    Some((*f.first()?, *f.get(5)?))
}

/// `callers` tasks call `svc` for `secs` seconds: (calls/s, p99 latency).
fn measure<S>(
    rt: &tokio::runtime::Runtime,
    svc: &S,
    callers: u64,
    replay: bool,
    secs: f64,
) -> (f64, Duration)
where
    S: Service<
            ToolRequest,
            Response = toolshield_core::ToolResponse,
            Error = toolshield_core::ToolError,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    rt.block_on(async {
        // The replayed keys: completed once, before the clock starts.
        let replayed: Arc<Vec<ToolRequest>> = Arc::new(
            (0..TOOLS)
                .map(|_| spread(KEY.fetch_add(1, Ordering::Relaxed)))
                .collect(),
        );
        for req in replayed.iter() {
            svc.clone().oneshot(req.clone()).await.expect("first");
        }
        let run = Duration::from_secs_f64(secs);
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for c in 0..callers {
            let svc = svc.clone();
            let replayed = Arc::clone(&replayed);
            set.spawn(async move {
                let mut lat = Vec::with_capacity(4096);
                let mut i = c;
                while started.elapsed() < run {
                    let req = if replay {
                        replayed[(i % TOOLS) as usize].clone()
                    } else {
                        spread(KEY.fetch_add(1, Ordering::Relaxed))
                    };
                    i += 1;
                    let t = Instant::now();
                    black_box(svc.clone().oneshot(req).await.expect("call"));
                    lat.push(t.elapsed());
                }
                lat
            });
        }
        let mut all = Vec::new();
        while let Some(lat) = set.join_next().await {
            all.extend(lat.expect("caller"));
        }
        let elapsed = started.elapsed();
        all.sort_unstable();
        let p99 = all
            .get(all.len().saturating_mul(99) / 100)
            .copied()
            .unwrap_or_default();
        (all.len() as f64 / elapsed.as_secs_f64(), p99)
    })
}

/// One table: first executions and replays at 1, 16 and 256 callers, each next to
/// redis-benchmark SET at the same concurrency, against the same server.
fn throughput_table<S>(name: &str, rt: &tokio::runtime::Runtime, svc: &S, port: u16, cluster: bool)
where
    S: Service<
            ToolRequest,
            Response = toolshield_core::ToolResponse,
            Error = toolshield_core::ToolError,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let secs = std::env::var("TOOLSHIELD_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.5);
    println!(
        "throughput, {name} ({secs} s per run; load average {})",
        load()
    );
    println!(
        "| callers | redis-benchmark SET/s (p99) | first executions/s (p99) | % of SET | replays/s (p99) | % of SET |"
    );
    println!("|---|---|---|---|---|---|");
    for callers in [1u64, 16, 256] {
        let set = redis_benchmark(port, callers, cluster);
        let (first, first_p99) = measure(rt, svc, callers, false, secs);
        let (replay, replay_p99) = measure(rt, svc, callers, true, secs);
        let (set_rps, set_p99) = set.unwrap_or((f64::NAN, f64::NAN));
        println!(
            "| {callers} | {set_rps:.0} ({set_p99:.3} ms) | {first:.0} ({:.3} ms) | {:.0} % | {replay:.0} ({:.3} ms) | {:.0} % |",
            first_p99.as_secs_f64() * 1e3,
            100.0 * first / set_rps,
            replay_p99.as_secs_f64() * 1e3,
            100.0 * replay / set_rps,
        );
    }
}

/// The 1-minute load average, as `/proc/loadavg` says.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn redis_idempotency(c: &mut Criterion) {
    let Some((url, _server)) = server() else {
        return;
    };
    let rt = rt();
    let conn = rt
        .block_on(RedisConnection::connect(
            RedisConfig::from_url(url.clone())
                .with_key_prefix(unique_prefix())
                .with_op_timeout(Duration::from_secs(2)),
        ))
        .expect("connect");
    let store = Arc::new(RedisIdempotencyStore::new(conn.clone()));
    let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), store).expect("config");
    let svc = layer.layer(BareTool::new());

    // ----- round trips, counted two ways -----
    rt.block_on(async {
        let mut s = svc.clone();
        s.ready().await.expect("ready").call(fresh()).await.expect("warm"); // loads the scripts
        let req = fresh();
        // Stats first, then the counter, so the INFO round trips are not counted.
        let st0 = commandstats(&conn).await;
        let rt0 = conn.round_trips();
        s.ready().await.expect("ready").call(req.clone()).await.expect("first");
        let rt1 = conn.round_trips();
        let st1 = commandstats(&conn).await;
        let rt1b = conn.round_trips();
        let replay = s.ready().await.expect("ready").call(req).await.expect("replay");
        assert!(replay.provenance.replayed);
        let rt2 = conn.round_trips();
        let st2 = commandstats(&conn).await;
        println!("(INFO commandstats also counts the commands a script runs: GET and SET inside EVALSHA)");
        println!(
            "round trips: first execution {} (commandstats: {}), replay {} (commandstats: {})",
            rt1 - rt0,
            delta(&st0, &st1),
            rt2 - rt1b,
            delta(&st1, &st2)
        );
    });

    // ----- throughput and p99 next to redis-benchmark, one node then the cluster -----
    if let Some(port) = url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
    {
        throughput_table("one node", &rt, &svc, port, false);
    }
    match RedisCluster::start() {
        Ok(cluster) => {
            let cconn = rt
                .block_on(RedisConnection::connect(
                    RedisConfig::cluster(cluster.seeds())
                        .with_key_prefix(unique_prefix())
                        .with_op_timeout(Duration::from_secs(2)),
                ))
                .expect("connect to the cluster");
            let cstore = Arc::new(RedisIdempotencyStore::new(cconn));
            let clayer =
                IdempotencyLayer::with_store(IdempotencyConfig::default(), cstore).expect("config");
            let csvc = clayer.layer(BareTool::new());
            throughput_table("cluster (3 masters)", &rt, &csvc, cluster.ports()[0], true);
        }
        Err(e) => println!("cluster figures skipped: no local cluster ({e})"),
    }

    let mut g = c.benchmark_group("redis_idempotency");
    let mut bare = BareTool::new();
    g.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| {
            let fut = bare.call(pay("bare"));
            async move { black_box(fut.await) }
        })
    });
    let replay_req = fresh();
    rt.block_on(svc.clone().oneshot(replay_req.clone()))
        .expect("first");
    for callers in [1u64, 16, 256] {
        for path in ["first_execution", "replay"] {
            let id = BenchmarkId::new(path, format!("{callers}_callers"));
            let replay_req = replay_req.clone();
            g.bench_with_input(id, &callers, |b, &callers| {
                b.to_async(&rt).iter_custom(|iters| {
                    let (svc, replay_req) = (svc.clone(), replay_req.clone());
                    async move {
                        let started = Instant::now();
                        let mut set = tokio::task::JoinSet::new();
                        for i in 0..callers {
                            let n = iters / callers + u64::from(i < iters % callers);
                            let (svc, replay_req) = (svc.clone(), replay_req.clone());
                            set.spawn(async move {
                                for _ in 0..n {
                                    let req = if path == "replay" {
                                        replay_req.clone()
                                    } else {
                                        fresh()
                                    };
                                    black_box(svc.clone().oneshot(req).await.expect("call"));
                                }
                            });
                        }
                        while set.join_next().await.is_some() {}
                        // Wall time per call across all callers: 1 s / this = calls per second.
                        started.elapsed()
                    }
                })
            });
        }
    }
    g.finish();
}

/// The shared breaker open-state on the call path: a closed breaker whose registry shares
/// its state (nothing open elsewhere: one atomic load; another key open elsewhere: a read
/// lock and a lookup), a key open elsewhere (rejected without calling the tool), next to
/// the same breaker unshared and a breaker open locally.
fn shared_breaker(c: &mut Criterion) {
    use toolshield_breaker::{BreakerConfig, BreakerLayer, BreakerRegistry};
    use toolshield_core::{ErrorKind, ToolError};
    use toolshield_redis::SharedBreakerState;

    let Some((url, _server)) = server() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let registry = || {
        BreakerRegistry::new(BreakerConfig {
            consecutive_failures: 1,
            open_wait: Duration::from_secs(3600),
            max_open_wait: Duration::from_secs(3600),
            ..BreakerConfig::default()
        })
        .expect("config")
    };
    let prefix = unique_prefix();
    let connect = || {
        rt.block_on(RedisConnection::connect(
            RedisConfig::from_url(url.clone()).with_key_prefix(prefix.clone()),
        ))
        .expect("connect")
    };
    let (unshared, quiet, busy, tripper) = (registry(), registry(), registry(), registry());
    let _quiet = rt
        .block_on(SharedBreakerState::attach(&quiet, connect(), "quiet"))
        .expect("attach");
    let busy_state = rt
        .block_on(SharedBreakerState::attach(&busy, connect(), "busy"))
        .expect("attach");
    let _tripper = rt
        .block_on(SharedBreakerState::attach(&tripper, connect(), "busy"))
        .expect("attach");
    // Another process opens `down` for an hour; `busy` learns of it.
    let failing =
        BreakerLayer::new(tripper.clone()).layer(tower::service_fn(|_r: ToolRequest| async {
            Err::<toolshield_core::ToolResponse, _>(ToolError::new(
                ErrorKind::UpstreamUnavailable,
                "down",
            ))
        }));
    let _ = rt.block_on(failing.oneshot(ToolRequest::new("down", json!({}))));
    // The publisher and subscriber tasks run while the runtime is driven.
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while busy_state.open_elsewhere("down").is_none() {
            assert!(Instant::now() < deadline, "the opening never arrived");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let local_open = registry();
    local_open.force_open("up");

    let mut g = c.benchmark_group("redis_shared_breaker");
    let up = ToolRequest::new("up", json!({"q": 1}));
    let down = ToolRequest::new("down", json!({"q": 1}));
    let cases: [(&str, &BreakerRegistry, &ToolRequest, bool); 5] = [
        ("closed_unshared", &unshared, &up, true),
        ("closed_shared_nothing_open_elsewhere", &quiet, &up, true),
        ("closed_shared_another_key_open_elsewhere", &busy, &up, true),
        ("open_elsewhere_rejected", &busy, &down, false),
        ("open_locally_rejected", &local_open, &up, false),
    ];
    let mut bare = BareTool::new();
    g.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| {
            let fut = bare.call(up.clone());
            async move { black_box(fut.await) }
        })
    });
    for (name, registry, req, passes) in cases {
        let mut svc = BreakerLayer::new(registry.clone()).layer(BareTool::new());
        let r = rt.block_on(svc.ready()).expect("ready").call(req.clone());
        assert_eq!(rt.block_on(r).is_ok(), passes, "{name}");
        g.bench_function(name, |b| {
            b.to_async(&rt).iter(|| {
                let fut = svc.call(req.clone());
                async move { black_box(fut.await.is_ok()) }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, redis_idempotency, shared_breaker);
criterion_main!(benches);
