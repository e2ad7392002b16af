//! Exactly-once across OS processes, not tasks: three `toolshield-replica` processes share
//! one Redis (and, in the second test, a Redis Cluster) and get duplicates of the same
//! mutations; one replica is killed with `SIGKILL` in the middle of a call and Redis is
//! paused (`SIGSTOP`/`SIGCONT`) while calls run. The tool's own append-only log (every
//! replica appends `start`, `effect` and `end` lines to one file) is the judge:
//!
//! - every key took effect at most once, and two executions of a key never overlapped
//!   (a later `start` only after the earlier execution ended, or after its process was
//!   killed);
//! - every caller that got a result got the one the effect produced, replayed or fresh;
//! - the key whose owner died ends completed by a takeover (one effect, by a live
//!   replica, which every later duplicate replays) or `OUTCOME_UNKNOWN`, never twice;
//! - the only errors are `STORE_UNAVAILABLE` (Redis paused: fail-closed), `IN_PROGRESS`
//!   and `OUTCOME_UNKNOWN`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use toolshield_redis::testing::{private_cluster, private_redis, unique_prefix, ClusterOptions};

const REPLICA: &str = env!("CARGO_BIN_EXE_toolshield-replica");
const KEYS: usize = 30;
const VICTIM: &str = "slow-victim";

struct Replica {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
}

impl Replica {
    fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            writeln!(stdin, "{line}").expect("write to a replica");
            stdin.flush().expect("flush to a replica");
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Answers from every replica: (replica index, line).
struct Answers {
    rx: Receiver<(usize, String)>,
    /// id -> (replica, answer words after the id)
    by_id: HashMap<String, (usize, Vec<String>)>,
}

impl Answers {
    fn take(&mut self, within: Duration) -> Option<(usize, String)> {
        self.rx.recv_timeout(within).ok()
    }

    /// Collects answers until every id in `ids` has one.
    fn wait_for(&mut self, ids: &[String], within: Duration) {
        let deadline = Instant::now() + within;
        while ids.iter().any(|id| !self.by_id.contains_key(id)) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((replica, line)) = self.take(left) else {
                let missing: Vec<&String> = ids
                    .iter()
                    .filter(|id| !self.by_id.contains_key(*id))
                    .collect();
                panic!("no answer within {within:?} for {missing:?}");
            };
            let mut words = line.split_whitespace().map(str::to_owned);
            if let Some(id) = words.next() {
                self.by_id.insert(id, (replica, words.collect()));
            }
        }
    }
}

fn spawn(
    idx: usize,
    target: &[String],
    log: &PathBuf,
    prefix: &str,
    tx: Sender<(usize, String)>,
) -> Replica {
    let mut child = Command::new(REPLICA)
        .args(target)
        .arg("--log")
        .arg(log)
        .arg("--prefix")
        .arg(prefix)
        .args([
            "--lease-ms",
            "1000",
            "--wait-ms",
            "5000",
            "--op-timeout-ms",
            "250",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the replica binary runs");
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((idx, line)).is_err() {
                break;
            }
        }
    });
    let pid = child.id();
    Replica {
        stdin: child.stdin.take(),
        child,
        pid,
    }
}

fn log_text(log: &PathBuf) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

fn append(log: &PathBuf, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the log");
    f.write_all(line.as_bytes()).expect("append to the log");
}

/// Runs the scenario against `target` (replica flags); `pause`/`resume` stop and continue
/// the Redis that serves the keys.
fn scenario(name: &str, target: Vec<String>, pause: &mut dyn FnMut(bool)) {
    let started = Instant::now();
    let log = std::env::temp_dir().join(format!(
        "toolshield-replicas-{}-{name}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&log);
    let prefix = unique_prefix();
    let (tx, rx) = channel();
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| spawn(i, &target, &log, &prefix, tx.clone()))
        .collect();
    drop(tx);
    let mut answers = Answers {
        rx,
        by_id: HashMap::new(),
    };
    let mut ready = 0;
    while ready < replicas.len() {
        match answers.take(Duration::from_secs(10)) {
            Some((_, line)) if line.starts_with("ready ") => ready += 1,
            Some((i, line)) => panic!("replica {i} said {line:?} before it was ready"),
            None => panic!("the replicas did not start"),
        }
    }

    // The victim: a slow call that replica 0 owns, killed in the middle of it.
    let victim_pid = replicas[0].pid;
    replicas[0].send(&format!("v0 {VICTIM} 2000"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !log_text(&log).contains(&format!("start {VICTIM} {victim_pid}\n")) {
        assert!(Instant::now() < deadline, "the victim call never started");
        std::thread::sleep(Duration::from_millis(10));
    }

    // Duplicates of every key at every replica, interleaved.
    let mut ids = Vec::new();
    for k in 0..KEYS {
        for (r, replica) in replicas.iter_mut().enumerate() {
            let id = format!("c{k}-{r}");
            replica.send(&format!("{id} k{k} 150"));
            if r != 0 {
                ids.push(id);
            }
        }
        if k == KEYS / 3 {
            // Kill the owner of the victim mid-call.
            let _ = replicas[0].child.kill();
            let _ = replicas[0].child.wait();
            replicas[0].stdin = None;
            append(&log, &format!("killed {victim_pid}\n"));
        }
        if k == 2 * KEYS / 3 {
            pause(true);
            std::thread::sleep(Duration::from_millis(400));
            pause(false);
        }
    }
    // Duplicates of the victim at the live replicas: they wait for its lease to run out,
    // and one of them takes the key over.
    for (r, replica) in replicas.iter_mut().enumerate().skip(1) {
        let id = format!("v{r}");
        replica.send(&format!("{id} {VICTIM} 2000"));
        ids.push(id);
    }
    answers.wait_for(&ids, Duration::from_secs(20));

    // A last duplicate of every key at a live replica: what the record says in the end.
    let mut last = Vec::new();
    for k in 0..KEYS {
        let id = format!("last{k}");
        replicas[1].send(&format!("{id} k{k} 150"));
        last.push(id);
    }
    replicas[1].send(&format!("lastv {VICTIM} 2000"));
    last.push("lastv".to_owned());
    answers.wait_for(&last, Duration::from_secs(20));
    for r in replicas.iter_mut() {
        r.stdin = None;
    }
    for r in replicas.iter_mut().skip(1) {
        let _ = r.child.wait();
    }

    // ----- the judgement, from the tool's log -----
    let text = log_text(&log);
    let mut violations = Vec::new();
    let mut effects: HashMap<String, Vec<String>> = HashMap::new();
    let mut running: HashMap<String, Vec<String>> = HashMap::new();
    let mut killed: Vec<String> = Vec::new();
    let mut taker_started = false;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["killed", pid] => killed.push((*pid).to_owned()),
            ["start", key, pid] => {
                let r = running.entry((*key).to_owned()).or_default();
                let live: Vec<&String> = r.iter().filter(|p| !killed.contains(p)).collect();
                if !live.is_empty() {
                    violations.push(format!("{key}: {pid} started while {live:?} ran"));
                }
                r.push((*pid).to_owned());
                if *key == VICTIM && *pid != victim_pid.to_string() {
                    taker_started = true;
                }
            }
            ["effect", key, pid] => effects
                .entry((*key).to_owned())
                .or_default()
                .push((*pid).to_owned()),
            ["end", key, pid] => {
                if let Some(r) = running.get_mut(*key) {
                    r.retain(|p| p != pid);
                }
            }
            other => violations.push(format!("a log line that is no log line: {other:?}")),
        }
    }
    for (key, pids) in &effects {
        if pids.len() > 1 {
            violations.push(format!("{key} took effect {} times: {pids:?}", pids.len()));
        }
    }
    if effects
        .get(VICTIM)
        .is_some_and(|p| p.contains(&victim_pid.to_string()))
    {
        violations.push("the killed replica's call took effect: it was not killed mid-call".into());
    }
    let mut errors: HashMap<String, usize> = HashMap::new();
    let mut oks = 0;
    let mut replays = 0;
    for (id, (_, words)) in &answers.by_id {
        let key = match id.as_str() {
            id if id.starts_with('v') || id == "lastv" => VICTIM.to_owned(),
            id if id.starts_with("last") => format!("k{}", &id[4..]),
            id => format!("k{}", id[1..].split('-').next().unwrap_or_default()),
        };
        match words.first().map(String::as_str) {
            Some("ok") => {
                oks += 1;
                replays += usize::from(words.get(1).map(String::as_str) == Some("1"));
                let pid = words.get(3).cloned().unwrap_or_default();
                let effect = effects.get(&key).and_then(|p| p.first());
                if effect != Some(&pid) {
                    violations.push(format!(
                        "{id} ({key}) got the result of {pid}, the effect was by {effect:?}"
                    ));
                }
            }
            Some("err") => {
                let code = words.get(1).cloned().unwrap_or_default();
                if !["STORE_UNAVAILABLE", "IN_PROGRESS", "OUTCOME_UNKNOWN"].contains(&code.as_str())
                {
                    violations.push(format!("{id} ({key}): unexpected error {code}"));
                }
                *errors.entry(code).or_default() += 1;
            }
            _ => violations.push(format!("{id}: a malformed answer {words:?}")),
        }
    }
    // The victim's end: completed by a takeover of one of its waiting duplicates (one
    // effect by a live replica, replayed by the last duplicate), or OUTCOME_UNKNOWN.
    let victim_end = &answers.by_id["lastv"].1;
    match victim_end.first().map(String::as_str) {
        Some("ok") => {
            if !taker_started
                || effects.get(VICTIM).map_or(0, Vec::len) != 1
                || victim_end.get(1).map(String::as_str) != Some("1")
            {
                violations.push(format!(
                    "the victim completed without one takeover effect: {victim_end:?}"
                ));
            }
        }
        Some("err") if victim_end.get(1).map(String::as_str) == Some("OUTCOME_UNKNOWN") => {}
        _ => violations.push(format!(
            "the victim ended neither completed nor OUTCOME_UNKNOWN: {victim_end:?}"
        )),
    }
    println!(
        "{name}: {} answers ({oks} ok, {replays} replays), errors {errors:?}, {} keys took effect, victim {:?}, {:?}",
        answers.by_id.len(),
        effects.len(),
        victim_end,
        started.elapsed()
    );
    let _ = std::fs::remove_file(&log);
    assert!(
        violations.is_empty(),
        "{name}: exactly-once violated:\n{}",
        violations.join("\n")
    );
    assert!(
        effects.len() >= KEYS,
        "{name}: every key took effect once: {}",
        effects.len()
    );
}

#[test]
fn replica_processes_on_one_redis_run_each_key_once_through_a_kill_and_a_pause() {
    let test = "replica_processes_on_one_redis_run_each_key_once_through_a_kill_and_a_pause";
    let Some(redis) = private_redis(test) else {
        return;
    };
    let target = vec!["--redis".to_owned(), redis.url()];
    scenario("one node", target, &mut |stop| {
        if stop {
            redis.pause()
        } else {
            redis.resume()
        }
    });
}

#[test]
fn replica_processes_on_a_cluster_run_each_key_once_through_a_kill_and_a_pause() {
    let test = "replica_processes_on_a_cluster_run_each_key_once_through_a_kill_and_a_pause";
    let Some(mut cluster) = private_cluster(test, ClusterOptions::default()) else {
        return;
    };
    let target = vec!["--cluster".to_owned(), cluster.seeds().join(",")];
    // Every key is of the tool `pay`: one slot, one master; that master is paused.
    let slot_owner = cluster
        .master_of("x:{pay}")
        .expect("the master of pay's slot");
    scenario("cluster", target, &mut |stop| {
        if stop {
            cluster.pause_node(slot_owner)
        } else {
            cluster.resume_node(slot_owner)
        }
    });
}
