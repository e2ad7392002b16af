//! A replica of a service that runs one mutating tool (`pay`) behind the idempotency layer
//! on Redis (one node or a cluster): the process the multi-process exactly-once test
//! starts several of, kills and watches.
//!
//! ```text
//! toolshield-replica (--redis URL | --cluster URL,URL,...) --log PATH --prefix P
//!                    [--lease-ms N] [--wait-ms N] [--op-timeout-ms N]
//! ```
//!
//! It prints `ready <pid>` once Redis answers, then reads one call per line on stdin,
//! `<id> <key> <work_ms>`, runs each concurrently as a `Mutating` call with idempotency
//! key `<key>` and payload `{"key", "work_ms"}`, and prints one line per answer:
//! `<id> ok <replayed 0|1> <unrecorded 0|1> <pid of the execution>` or `<id> err <CODE>`.
//! The tool appends to the log (one `write` per line, `O_APPEND`) `start <key> <pid>` when
//! it is called, `effect <key> <pid>` after `work_ms` (its side effect), and
//! `end <key> <pid>` when its future ends or is dropped. On end of input it finishes the
//! calls under way and exits.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncBufReadExt as _;
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer, OnPending};
use toolshield_redis::{RedisConfig, RedisConnection, RedisIdempotencyStore};
use tower::{service_fn, Layer as _, ServiceExt as _};

struct Args {
    config: RedisConfig,
    log: String,
    lease: Duration,
    wait: Duration,
}

fn parse() -> Result<Args, String> {
    let mut redis: Option<RedisConfig> = None;
    let mut log = None;
    let mut prefix = String::new();
    let mut lease = Duration::from_millis(1000);
    let mut wait = Duration::from_secs(5);
    let mut op_timeout = Duration::from_millis(250);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let ms = || {
            value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|e| format!("{flag}: {e}"))
        };
        match flag.as_str() {
            "--redis" => redis = Some(RedisConfig::from_url(value.clone())),
            "--cluster" => redis = Some(RedisConfig::cluster(value.split(','))),
            "--log" => log = Some(value.clone()),
            "--prefix" => prefix = value.clone(),
            "--lease-ms" => lease = ms()?,
            "--wait-ms" => wait = ms()?,
            "--op-timeout-ms" => op_timeout = ms()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let config = redis
        .ok_or("--redis or --cluster is required")?
        .with_key_prefix(prefix)
        .with_op_timeout(op_timeout);
    Ok(Args {
        config,
        log: log.ok_or("--log is required")?,
        lease,
        wait,
    })
}

/// Appends one line to the log in one `write` (atomic for a short line with `O_APPEND`).
fn append(log: &str, line: String) {
    let opened = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log);
    match opened {
        Ok(mut f) => {
            if let Err(e) = f.write_all(line.as_bytes()) {
                eprintln!("replica: cannot write the log: {e}");
            }
        }
        Err(e) => eprintln!("replica: cannot open the log: {e}"),
    }
}

/// One line on stdout; a closed stdout (the test went away) is ignored.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Writes `end` when the execution's future ends or is dropped.
struct End {
    log: Arc<str>,
    key: String,
}

impl Drop for End {
    fn drop(&mut self) {
        append(
            &self.log,
            format!("end {} {}\n", self.key, std::process::id()),
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("replica: {e}");
            std::process::exit(2);
        }
    };
    let conn = match RedisConnection::connect(args.config).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("replica: cannot connect: {e}");
            std::process::exit(1);
        }
    };
    let config = IdempotencyConfig {
        on_pending: OnPending::Wait,
        lease: args.lease,
        wait_timeout: args.wait,
        poll_interval: Duration::from_millis(20),
        max_poll_interval: Duration::from_millis(100),
        ..IdempotencyConfig::default()
    };
    let layer =
        match IdempotencyLayer::with_store(config, Arc::new(RedisIdempotencyStore::new(conn))) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("replica: {e}");
                std::process::exit(2);
            }
        };
    let log: Arc<str> = Arc::from(args.log.as_str());
    let pid = std::process::id();
    let tool_log = Arc::clone(&log);
    let svc = layer.layer(service_fn(move |req: ToolRequest| {
        let log = Arc::clone(&tool_log);
        async move {
            let key = req.get_idempotency_key().unwrap_or("-").to_owned();
            let work = req.payload()["work_ms"].as_u64().unwrap_or(0);
            append(&log, format!("start {key} {pid}\n"));
            let _end = End {
                log: Arc::clone(&log),
                key: key.clone(),
            };
            tokio::time::sleep(Duration::from_millis(work)).await;
            append(&log, format!("effect {key} {pid}\n"));
            Ok::<_, ToolError>(ToolResponse::new(json!({"key": key, "pid": pid})))
        }
    }));

    say(&format!("ready {pid}"));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut calls = tokio::task::JoinSet::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut parts = line.split_whitespace();
        let (Some(id), Some(key), Some(work)) = (parts.next(), parts.next(), parts.next()) else {
            eprintln!("replica: bad line {line:?}");
            continue;
        };
        let work: u64 = work.parse().unwrap_or(0);
        let (id, key) = (id.to_owned(), key.to_owned());
        let req = ToolRequest::new("pay", json!({"key": key, "work_ms": work}))
            .kind(CallKind::Mutating)
            .idempotency_key(key);
        let svc = svc.clone();
        calls.spawn(async move {
            let answer = match svc.oneshot(req).await {
                Ok(resp) => format!(
                    "{id} ok {} {} {}",
                    u8::from(resp.provenance.replayed),
                    u8::from(resp.provenance.unrecorded),
                    resp.output["pid"]
                ),
                Err(e) => format!("{id} err {}", e.code()),
            };
            say(&answer);
        });
    }
    while calls.join_next().await.is_some() {}
}
