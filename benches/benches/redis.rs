//! The Redis idempotency path: round trips per first execution and per replay, calls per
//! second at 1, 16 and 64 concurrent callers, next to `redis-benchmark` SET figures taken
//! in the same run against the same server.
//!
//! Runs against `TOOLSHIELD_REDIS_URL` when set, else a private `redis-server` on a free
//! loopback port; skips (printing why) when neither is possible.

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
use toolshield_redis::testing::{unique_prefix, RedisServer};
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

fn redis_benchmark(port: u16, extra: &[&str]) {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-p", &port.to_string(), "-t", "set", "-n", "100000", "-q"]);
    cmd.args(extra);
    println!(
        "$ redis-benchmark -p {port} -t set -n 100000 -q {}",
        extra.join(" ")
    );
    match cmd.output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text
                .split(['\r', '\n'])
                .filter(|l| l.contains("requests per second"))
            {
                println!("  {}", line.trim());
            }
        }
        Err(e) => println!("  redis-benchmark not run: {e}"),
    }
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

    // ----- redis-benchmark on the same server, same run -----
    if let Some(port) = url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
    {
        redis_benchmark(port, &[]);
        redis_benchmark(port, &["-c", "1"]);
        redis_benchmark(port, &["-c", "16"]);
        redis_benchmark(port, &["-c", "64"]);
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
    for callers in [1u64, 16, 64] {
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

criterion_group!(benches, redis_idempotency);
criterion_main!(benches);
