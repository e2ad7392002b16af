//! Test support (feature `testing`): a private `redis-server` per test.
//!
//! [`RedisServer::start`] runs `redis-server --port N --bind 127.0.0.1 --save ''
//! --appendonly no` on a free loopback port, waits until it answers `PING`, and kills it
//! on drop. [`RedisServer::start_persistent`] keeps an append-only file in a private
//! temporary directory instead, so a [`restart`](RedisServer::restart) on the same port
//! finds the data again. [`pause`](RedisServer::pause) / [`resume`](RedisServer::resume)
//! stop and continue the process (`SIGSTOP` / `SIGCONT`): a Redis that accepts
//! connections but answers nothing.
//!
//! [`RedisCluster::start`] runs a local Redis Cluster (three masters by default) the same
//! way, joined with `redis-cli --cluster create`, and kills every node on drop.
//!
//! [`test_redis`] picks what a test runs against: the Redis at `TOOLSHIELD_REDIS_URL` when
//! that is set, else a private server. When neither is possible it prints a loud skip
//! notice and returns `None`, except when `CI` is set, where it panics: CI runs the Redis
//! tests, it never skips them.
//!
//! ```no_run
//! use toolshield_redis::testing::RedisServer;
//!
//! let server = RedisServer::start().expect("redis-server");
//! println!("redis at {}", server.url());
//! // killed when `server` is dropped
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a server may take to answer `PING` after it was started.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A `redis-server` process this test owns, on a free loopback port, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: Option<PathBuf>,
}

/// The `redis-server` binary: `TOOLSHIELD_REDIS_SERVER`, else `redis-server` on `PATH`.
fn binary() -> String {
    std::env::var("TOOLSHIELD_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn temp_dir() -> Result<PathBuf, String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "toolshield-redis-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Whether a Redis on `port` answers `PING` with `PONG` (not `LOADING`).
fn answers_ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(n) => buf[..n].starts_with(b"+PONG"),
        Err(_) => false,
    }
}

impl RedisServer {
    /// A fresh in-memory server (`--save '' --appendonly no`) on a free loopback port.
    pub fn start() -> Result<Self, String> {
        Self::start_with(None)
    }

    /// A server with an append-only file (`appendfsync always`) in a private temporary
    /// directory: a [`kill`](Self::kill) then [`restart`](Self::restart) keeps every
    /// acknowledged write.
    pub fn start_persistent() -> Result<Self, String> {
        Self::start_with(Some(temp_dir()?))
    }

    fn start_with(dir: Option<PathBuf>) -> Result<Self, String> {
        let mut last = String::new();
        // A port found free may be taken before the server binds it: try a few.
        for _ in 0..5 {
            let mut server = RedisServer {
                port: free_port()?,
                child: None,
                dir: dir.clone(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    // Keep the directory for the next try.
                    server.dir = None;
                    last = e;
                }
            }
        }
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        Err(last)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new(binary());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("");
        match &self.dir {
            Some(dir) => cmd
                .arg("--dir")
                .arg(dir)
                .arg("--appendonly")
                .arg("yes")
                .arg("--appendfsync")
                .arg("always"),
            None => cmd.arg("--appendonly").arg("no"),
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run `{}`: {e}", binary()))?;
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if answers_ping(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "redis-server on port {} exited with {status}",
                    self.port
                ));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "redis-server on port {} did not answer PING within {READY_WITHIN:?}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server was started with an append-only file.
    pub fn is_persistent(&self) -> bool {
        self.dir.is_some()
    }

    /// Kills the server (`SIGKILL`: no shutdown, no final save) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            Self::signal_pid(child.id(), "-CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (and, if persistent, the same directory),
    /// waiting until it answers `PING`.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                // The port may still be held for a moment by the killed process.
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Stops the process (`SIGSTOP`): connections stay open, nothing is answered.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            Self::signal_pid(pid, "-STOP");
        }
    }

    /// Continues a paused process (`SIGCONT`).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            Self::signal_pid(pid, "-CONT");
        }
    }

    fn signal_pid(pid: u32, signal: &str) {
        let _ = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What a test runs against.
#[derive(Debug)]
pub enum TestRedis {
    /// The Redis at `TOOLSHIELD_REDIS_URL`.
    External(String),
    /// A private server owned by the test.
    Private(RedisServer),
}

impl TestRedis {
    /// The URL to connect to.
    pub fn url(&self) -> String {
        match self {
            TestRedis::External(url) => url.clone(),
            TestRedis::Private(s) => s.url(),
        }
    }
}

/// Reports that `test` cannot run: panics when `CI` is set, else prints a loud notice.
pub fn unavailable(test: &str, why: &str) {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0");
    if ci {
        panic!("{test}: no Redis to test against ({why}); CI must run the Redis tests: install redis-server or set TOOLSHIELD_REDIS_URL");
    }
    // Straight to the process's stderr, not through `eprintln!`: the test harness
    // captures the print macros of a passing test, which would hide the skip from a plain
    // `cargo test` run.
    let bar = "!".repeat(78);
    let notice = format!(
        "\n{bar}\n!!! SKIPPED {test}: no Redis to test against ({why})\n!!! install redis-server or set TOOLSHIELD_REDIS_URL to run it\n{bar}\n"
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), notice.as_bytes());
}

/// The Redis a test runs against: `TOOLSHIELD_REDIS_URL` when set, else a private
/// server; `None` after a skip notice (a panic under `CI`) when neither is possible.
pub fn test_redis(test: &str) -> Option<TestRedis> {
    if let Ok(url) = std::env::var("TOOLSHIELD_REDIS_URL") {
        if !url.is_empty() {
            return Some(TestRedis::External(url));
        }
    }
    private_redis(test).map(TestRedis::Private)
}

/// A private server, for tests that kill, restart or pause it (they never touch the
/// server at `TOOLSHIELD_REDIS_URL`); `None` after a skip notice (a panic under `CI`).
pub fn private_redis(test: &str) -> Option<RedisServer> {
    match RedisServer::start() {
        Ok(s) => Some(s),
        Err(e) => {
            unavailable(test, &e);
            None
        }
    }
}

/// A private persistent server (see [`RedisServer::start_persistent`]); `None` after a
/// skip notice (a panic under `CI`).
pub fn private_persistent_redis(test: &str) -> Option<RedisServer> {
    match RedisServer::start_persistent() {
        Ok(s) => Some(s),
        Err(e) => {
            unavailable(test, &e);
            None
        }
    }
}

/// A key prefix no other test uses (`t<pid>-<n>:`), so tests can share one external Redis.
pub fn unique_prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "t{}-{nanos}-{}:",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

// ----- Redis Cluster -----

/// The `redis-cli` binary: `TOOLSHIELD_REDIS_CLI`, else `redis-cli` on `PATH`.
fn cli_binary() -> String {
    std::env::var("TOOLSHIELD_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// A free loopback port whose cluster bus port (port + 10000) is free too.
fn free_cluster_port() -> Result<u16, String> {
    for _ in 0..50 {
        let port = free_port()?;
        let Some(bus) = port.checked_add(10_000) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port pair (port, port + 10000) for a cluster node".to_owned())
}

/// How a [`RedisCluster`] is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterOptions {
    /// Masters (at least 3, as `redis-cli --cluster create` requires).
    pub masters: usize,
    /// Replicas per master (`--cluster-replicas`).
    pub replicas_per_master: usize,
    /// `cluster-node-timeout`: how long a node may be unreachable before the others mark
    /// it failed (and a replica of a failed master is promoted).
    pub node_timeout: Duration,
    /// `cluster-require-full-coverage`: `true` (Redis's default) stops the whole cluster
    /// once a slot has no master; `false` keeps serving the slots that still have one.
    pub require_full_coverage: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            masters: 3,
            replicas_per_master: 0,
            node_timeout: Duration::from_millis(1000),
            require_full_coverage: false,
        }
    }
}

/// One node of a [`RedisCluster`].
#[derive(Debug)]
struct ClusterNode {
    port: u16,
    child: Option<Child>,
}

/// A local Redis Cluster this test owns: `redis-server --cluster-enabled yes` nodes on
/// free loopback ports (each with its own `--cluster-config-file` in a private temporary
/// directory, `--save '' --appendonly no`), joined by `redis-cli --cluster create ...
/// --cluster-yes`, ready once every node reports `cluster_state:ok` and knows every
/// node. Every node is killed by its process id on drop.
///
/// ```no_run
/// use toolshield_redis::testing::RedisCluster;
///
/// let cluster = RedisCluster::start().expect("redis-server and redis-cli");
/// println!("seeds: {:?}", cluster.seeds());
/// // every node is killed when `cluster` is dropped
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    dir: PathBuf,
    options: ClusterOptions,
}

/// Runs `redis-cli -p port args...` and returns its standard output.
fn cli(port: u16, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cli_binary())
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{}`: {e}", cli_binary()))?;
    if !out.status.success() {
        return Err(format!(
            "`redis-cli -p {port} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl RedisCluster {
    /// Three masters, no replicas, a 1 s node timeout, and the surviving masters keep
    /// serving their slots when one fails (`cluster-require-full-coverage no`).
    pub fn start() -> Result<Self, String> {
        Self::start_with(ClusterOptions::default())
    }

    /// A cluster laid out as `options` says.
    pub fn start_with(options: ClusterOptions) -> Result<Self, String> {
        if options.masters < 3 {
            return Err("a cluster needs at least 3 masters".to_owned());
        }
        let dir = temp_dir()?;
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            dir,
            options,
        };
        let total = options.masters * (1 + options.replicas_per_master);
        for _ in 0..total {
            let node = cluster.spawn_node()?;
            cluster.nodes.push(node);
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = Command::new(cli_binary());
        create
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-replicas")
            .arg(options.replicas_per_master.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null());
        let out = create
            .output()
            .map_err(|e| format!("cannot run `{}`: {e}", cli_binary()))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        cluster.wait_ready(READY_WITHIN)?;
        Ok(cluster)
    }

    fn spawn_node(&self) -> Result<ClusterNode, String> {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_cluster_port()?;
            let conf = self.dir.join(format!("nodes-{port}.conf"));
            let mut child = Command::new(binary())
                .arg("--port")
                .arg(port.to_string())
                .arg("--bind")
                .arg("127.0.0.1")
                .arg("--save")
                .arg("")
                .arg("--appendonly")
                .arg("no")
                .arg("--dir")
                .arg(&self.dir)
                .arg("--cluster-enabled")
                .arg("yes")
                .arg("--cluster-config-file")
                .arg(&conf)
                .arg("--cluster-node-timeout")
                .arg(self.options.node_timeout.as_millis().to_string())
                .arg("--cluster-require-full-coverage")
                .arg(if self.options.require_full_coverage {
                    "yes"
                } else {
                    "no"
                })
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run `{}`: {e}", binary()))?;
            let deadline = Instant::now() + READY_WITHIN;
            loop {
                if answers_ping(port) {
                    return Ok(ClusterNode {
                        port,
                        child: Some(child),
                    });
                }
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!("cluster node on port {port} exited with {status}");
                    break;
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "cluster node on port {port} did not answer PING within {READY_WITHIN:?}"
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Err(last)
    }

    /// Waits until every running node reports `cluster_state:ok`, knows every node and
    /// sees every slot assigned, and every replication link is settled: each replica's
    /// link is up with no sync in progress, each master has its replicas online. A
    /// replica still in its first full sync when a test writes could take a second one
    /// later, and a test that kills its master then could promote a replica without the
    /// writes.
    pub fn wait_ready(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        let nodes = self.nodes.len().to_string();
        loop {
            let mut why = None;
            for n in self.nodes.iter().filter(|n| n.child.is_some()) {
                let info = cli(n.port, &["cluster", "info"]).unwrap_or_default();
                let replication = cli(n.port, &["info", "replication"]).unwrap_or_default();
                let field = |text: &str, name: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(|v| v.trim().to_owned())
                };
                if field(&info, "cluster_state:").as_deref() != Some("ok")
                    || field(&info, "cluster_known_nodes:").as_deref() != Some(nodes.as_str())
                    || field(&info, "cluster_slots_assigned:").as_deref() != Some("16384")
                {
                    why = Some(format!("node {}: {}", n.port, info.replace("\r\n", " ")));
                    break;
                }
                if !replication_settled(&replication, self.options.replicas_per_master) {
                    why = Some(format!(
                        "node {}: {}",
                        n.port,
                        replication.replace("\r\n", " ")
                    ));
                    break;
                }
            }
            let Some(why) = why else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                return Err(format!("the cluster is not ready within {within:?}: {why}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The seed URLs (`redis://127.0.0.1:PORT`) of every node, for
    /// [`RedisConfig::cluster`](crate::RedisConfig::cluster).
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The ports of every node, in the order they were started.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The process ids of the nodes that run.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.child.as_ref().map(Child::id))
            .collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of a running node).
    pub fn slot_of(&self, key: &str) -> Result<u16, String> {
        let port = self.running_port()?;
        let out = cli(port, &["cluster", "keyslot", key])?;
        out.trim()
            .parse()
            .map_err(|e| format!("cluster keyslot answered {out:?}: {e}"))
    }

    /// The port of the master that serves `key`'s slot, as a running node sees the
    /// cluster (`CLUSTER NODES`).
    pub fn master_of(&self, key: &str) -> Result<u16, String> {
        let slot = self.slot_of(key)?;
        let port = self.running_port()?;
        let nodes = cli(port, &["cluster", "nodes"])?;
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let owns = f[8..].iter().any(|range| {
                let mut ends = range.splitn(2, '-');
                let lo = ends.next().and_then(|s| s.parse::<u16>().ok());
                let hi = ends.next().and_then(|s| s.parse::<u16>().ok()).or(lo);
                matches!((lo, hi), (Some(lo), Some(hi)) if lo <= slot && slot <= hi)
            });
            if owns {
                let addr = f[1].split('@').next().unwrap_or_default();
                let p = addr.rsplit(':').next().unwrap_or_default();
                return p
                    .parse()
                    .map_err(|e| format!("cluster nodes line {line:?}: {e}"));
            }
        }
        Err(format!("no master serves slot {slot}"))
    }

    fn running_port(&self) -> Result<u16, String> {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .map(|n| n.port)
            .ok_or_else(|| "no node of the cluster runs".to_owned())
    }

    fn node(&mut self, port: u16) -> Option<&mut ClusterNode> {
        self.nodes.iter_mut().find(|n| n.port == port)
    }

    /// Kills the node on `port` (`SIGKILL`) and waits for it to exit.
    pub fn kill_node(&mut self, port: u16) {
        if let Some(n) = self.node(port) {
            if let Some(mut child) = n.child.take() {
                signal(child.id(), "-CONT");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Stops the node on `port` (`SIGSTOP`): its connections stay open, nothing is
    /// answered.
    pub fn pause_node(&mut self, port: u16) {
        if let Some(pid) = self
            .node(port)
            .and_then(|n| n.child.as_ref().map(Child::id))
        {
            signal(pid, "-STOP");
        }
    }

    /// Continues a stopped node (`SIGCONT`).
    pub fn resume_node(&mut self, port: u16) {
        if let Some(pid) = self
            .node(port)
            .and_then(|n| n.child.as_ref().map(Child::id))
        {
            signal(pid, "-CONT");
        }
    }

    /// Waits until the running nodes report `cluster_state:ok` again with `port` seen as
    /// failed and its slots served by a promoted replica (after a failover).
    pub fn wait_failover(&self, port: u16, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let mut done = true;
            for n in self.nodes.iter().filter(|n| n.child.is_some()) {
                let info = cli(n.port, &["cluster", "info"]).unwrap_or_default();
                let nodes = cli(n.port, &["cluster", "nodes"]).unwrap_or_default();
                let dead_failed = nodes
                    .lines()
                    .any(|l| l.contains(&format!(":{port}@")) && l.contains("fail"));
                if !info.contains("cluster_state:ok") || !dead_failed {
                    done = false;
                    break;
                }
            }
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no failover of node {port} within {within:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether a node's `INFO replication` shows its links settled: a replica's link up with
/// no sync in progress; a master with `replicas` replicas, every one online.
fn replication_settled(info: &str, replicas: usize) -> bool {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    match field("role:") {
        Some("slave") => {
            field("master_link_status:") == Some("up")
                && field("master_sync_in_progress:") == Some("0")
        }
        Some("master") => {
            let online = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains(':'))
                .filter(|l| l.contains("state=online"))
                .count();
            online >= replicas
        }
        _ => false,
    }
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let ports = self.ports();
        for port in ports {
            self.kill_node(port);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private cluster laid out as `options` says; `None` after a skip notice (a panic
/// under `CI`) when `redis-server` or `redis-cli` is missing or the cluster does not form.
pub fn private_cluster(test: &str, options: ClusterOptions) -> Option<RedisCluster> {
    match RedisCluster::start_with(options) {
        Ok(c) => Some(c),
        Err(e) => {
            unavailable(test, &e);
            None
        }
    }
}
