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
    eprintln!();
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("!!! SKIPPED {test}: no Redis to test against ({why})");
    eprintln!("!!! install redis-server or set TOOLSHIELD_REDIS_URL to run it");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
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
