//! A cached call dropped at every `.await` it passes through (driven for exactly N polls,
//! then dropped, for every N up to the polls it needs to finish), on the paused clock:
//! no flight is left open, the followers of a dropped leader are answered, a call that
//! did not finish writes no entry, and a store operation in flight when the call is
//! dropped leaves no partial entry. Over the in-memory store (answered at once) and over
//! a store whose every operation takes time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::{sleep, timeout};
use toolshield_cache::testing::FaultyCacheStore;
use toolshield_cache::{storage_key, CacheConfig, CacheLayer, CacheStore, InMemoryCacheStore};
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::BoxedTool;
use toolshield_test::{drive, polls_to_finish, Driven};
use tower::{service_fn, Layer, Service, ServiceExt};

const TTL: Duration = Duration::from_secs(60);
/// Far longer than any call here takes: a call still unanswered then hangs.
const NEVER: Duration = Duration::from_secs(3_600);

fn weather() -> ToolRequest {
    ToolRequest::new("weather", json!({"city": "Paris"})).kind(CallKind::ReadOnly)
}

fn key() -> String {
    let digest = weather().payload_digest().expect("digest");
    storage_key("weather", None, &digest)
}

/// A tool taking 1 s, answering `{"n": <its execution number>}`, counting its starts and
/// noting the number of each execution that ran to its end.
fn tool(started: &Arc<AtomicUsize>, ended: &Arc<Mutex<Vec<u64>>>) -> BoxedTool {
    let (started, ended) = (Arc::clone(started), Arc::clone(ended));
    BoxedTool::new(service_fn(move |_req: ToolRequest| {
        let n = started.fetch_add(1, Ordering::SeqCst) + 1;
        let ended = Arc::clone(&ended);
        async move {
            sleep(Duration::from_secs(1)).await;
            ended.lock().expect("ended").push(n as u64);
            Ok::<_, ToolError>(ToolResponse::new(json!({ "n": n })))
        }
    }))
}

fn n_of(r: &Result<ToolResponse, ToolError>) -> Value {
    match r {
        Ok(resp) => resp.output["n"].clone(),
        Err(e) => panic!("a call that was not dropped failed: {e}"),
    }
}

/// The stores a case runs over: the in-memory one as it is, and the same behind 50 ms of
/// latency on every operation (the full path, with store awaits to drop at).
#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Slow,
}

struct Setup {
    layer: CacheLayer,
    memory: Arc<InMemoryCacheStore>,
    started: Arc<AtomicUsize>,
    ended: Arc<Mutex<Vec<u64>>>,
}

impl Setup {
    fn new(kind: Kind) -> Self {
        let memory = Arc::new(InMemoryCacheStore::new());
        let config = CacheConfig::default().with_ttl(TTL);
        let layer = match kind {
            Kind::Memory => {
                CacheLayer::with_store(config, Arc::clone(&memory) as Arc<dyn CacheStore>)
            }
            Kind::Slow => {
                let plan = FaultPlan::new();
                plan.always("get", Fault::Delay(Duration::from_millis(50)));
                plan.always("put", Fault::Delay(Duration::from_millis(50)));
                let faulty = FaultyCacheStore::from_arc(Arc::clone(&memory), plan);
                CacheLayer::with_store(config, Arc::new(faulty))
            }
        }
        .expect("valid config");
        Setup {
            layer,
            memory,
            started: Arc::new(AtomicUsize::new(0)),
            ended: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn tool(&self) -> BoxedTool {
        tool(&self.started, &self.ended)
    }

    /// One call's future, made the way a caller makes it (readiness, then `call`).
    async fn call(&self) -> impl std::future::Future<Output = Result<ToolResponse, ToolError>> {
        let mut svc = self.layer.layer(self.tool());
        svc.ready().await.expect("ready");
        svc.call(weather())
    }

    /// What the store holds for the call's key (read without latency).
    /// How many executions of the tool ran to their end.
    fn ended(&self) -> usize {
        self.ended.lock().expect("ended").len()
    }

    /// Whether execution `n` ran to its end.
    fn ran_to_end(&self, n: &Value) -> bool {
        n.as_u64()
            .is_some_and(|n| self.ended.lock().expect("ended").contains(&n))
    }

    fn entry(&self) -> Option<Value> {
        self.memory.get_now(&key()).map(|l| l.response.output)
    }
}

async fn polls_of_a_miss(kind: Kind) -> usize {
    let s = Setup::new(kind);
    let (polls, out) = polls_to_finish(s.call().await).await;
    assert_eq!(n_of(&out), json!(1));
    polls
}

async fn a_dropped_miss_leaves_no_entry_and_no_flight(kind: Kind) {
    let needed = polls_of_a_miss(kind).await;
    assert!(needed >= 2, "a miss awaits the tool: {needed} polls");
    for n in 0..=needed {
        let s = Setup::new(kind);
        let driven = drive(s.call().await, n).await;
        // Whatever a put in flight does later, it has had time to land by now.
        sleep(Duration::from_secs(5)).await;
        match &driven {
            Driven::Finished(out) => {
                assert_eq!(n_of(out), json!(1), "{kind:?}, {n} polls");
                assert_eq!(s.ended(), 1);
                if let Kind::Memory = kind {
                    assert_eq!(s.entry(), Some(json!({"n": 1})), "{kind:?}, {n} polls");
                }
            }
            Driven::Dropped => {
                // Only a complete answer of a tool that finished is ever stored.
                let entry = s.entry();
                assert!(
                    entry.is_none() || (entry == Some(json!({"n": 1})) && s.ended() == 1),
                    "{kind:?}, dropped after {n} polls: entry {entry:?}, tool ended {} times",
                    s.ended()
                );
                if s.ended() == 0 {
                    assert_eq!(
                        entry, None,
                        "{kind:?}, {n} polls: an unfinished call wrote an entry"
                    );
                }
            }
        }
        // No flight is left open: the next call is answered (a hit, or the tool again).
        let next = timeout(NEVER, s.call().await)
            .await
            .unwrap_or_else(|_| panic!("{kind:?}, dropped after {n} polls: the next call hangs"));
        let got = n_of(&next);
        let ran = s.started.load(Ordering::SeqCst);
        assert_eq!(
            got,
            json!(ran),
            "{kind:?}, {n} polls: the next call got {got}, tool started {ran}"
        );
        assert_eq!(s.entry(), Some(json!({ "n": ran })), "{kind:?}, {n} polls");
    }
}

#[tokio::test(start_paused = true)]
async fn a_miss_dropped_at_any_await_leaves_no_entry_and_no_flight_in_memory() {
    a_dropped_miss_leaves_no_entry_and_no_flight(Kind::Memory).await;
}

#[tokio::test(start_paused = true)]
async fn a_miss_dropped_at_any_await_leaves_no_entry_and_no_flight_with_a_slow_store() {
    a_dropped_miss_leaves_no_entry_and_no_flight(Kind::Slow).await;
}

async fn followers_of_a_dropped_leader_are_answered(kind: Kind) {
    let needed = polls_of_a_miss(kind).await;
    for n in 0..=needed {
        let s = Setup::new(kind);
        let leader = s.call().await;
        // Two followers join while the leader is in flight (or lead, if it never is).
        let mut followers = tokio::task::JoinSet::new();
        for _ in 0..2 {
            let svc = s.layer.layer(s.tool());
            followers.spawn(async move { svc.oneshot(weather()).await });
        }
        let driven = drive(leader, n).await;
        let mut answers = Vec::new();
        while let Some(joined) = timeout(NEVER, followers.join_next())
            .await
            .unwrap_or_else(|_| {
                panic!("{kind:?}, leader dropped after {n} polls: a follower hangs")
            })
        {
            answers.push(n_of(&joined.expect("follower task")));
        }
        let ran = s.started.load(Ordering::SeqCst);
        assert!(
            ran <= 2,
            "{kind:?}, {n} polls: the tool ran {ran} times for three callers"
        );
        if driven.finished() {
            assert_eq!(
                ran, 1,
                "{kind:?}, {n} polls: a finished leader's followers ran the tool"
            );
        }
        // Every follower got a result the tool produced to its end.
        for a in &answers {
            assert!(
                s.ran_to_end(a),
                "{kind:?}, {n} polls: answer {a} of an unfinished run"
            );
        }
        sleep(Duration::from_secs(5)).await;
        match s.entry() {
            Some(entry) => assert!(answers.contains(&entry["n"]), "{kind:?}, {n} polls"),
            // A leader dropped while its write was in flight, after it handed its answer
            // over: the followers were answered, and nothing was stored.
            None => assert!(
                !driven.finished() && s.ended() == 1 && answers.iter().all(|a| *a == json!(1)),
                "{kind:?}, {n} polls: the followers' answer {answers:?} is not cached"
            ),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn followers_of_a_leader_dropped_at_any_await_are_answered_in_memory() {
    followers_of_a_dropped_leader_are_answered(Kind::Memory).await;
}

#[tokio::test(start_paused = true)]
async fn followers_of_a_leader_dropped_at_any_await_are_answered_with_a_slow_store() {
    followers_of_a_dropped_leader_are_answered(Kind::Slow).await;
}

async fn a_dropped_follower_leaves_its_leader_whole(kind: Kind) {
    // The polls a follower takes: a leader in flight, then a follower to its end.
    let s = Setup::new(kind);
    let leader = tokio::spawn(s.layer.layer(s.tool()).oneshot(weather()));
    sleep(Duration::from_millis(200)).await;
    let (needed, out) = polls_to_finish(s.call().await).await;
    assert_eq!(n_of(&out), json!(1));
    assert_eq!(n_of(&leader.await.expect("leader")), json!(1));
    for n in 0..=needed {
        let s = Setup::new(kind);
        let leader = tokio::spawn(s.layer.layer(s.tool()).oneshot(weather()));
        sleep(Duration::from_millis(200)).await;
        let other = tokio::spawn(s.layer.layer(s.tool()).oneshot(weather()));
        let _ = drive(s.call().await, n).await;
        let led = timeout(NEVER, leader).await.expect("the leader hangs");
        assert_eq!(n_of(&led.expect("leader")), json!(1), "{kind:?}, {n} polls");
        let followed = timeout(NEVER, other)
            .await
            .expect("the other follower hangs");
        assert_eq!(
            n_of(&followed.expect("follower")),
            json!(1),
            "{kind:?}, {n} polls"
        );
        assert_eq!(s.started.load(Ordering::SeqCst), 1, "{kind:?}, {n} polls");
        sleep(Duration::from_secs(5)).await;
        assert_eq!(s.entry(), Some(json!({"n": 1})), "{kind:?}, {n} polls");
    }
}

#[tokio::test(start_paused = true)]
async fn a_follower_dropped_at_any_await_leaves_its_leader_whole_in_memory() {
    a_dropped_follower_leaves_its_leader_whole(Kind::Memory).await;
}

#[tokio::test(start_paused = true)]
async fn a_follower_dropped_at_any_await_leaves_its_leader_whole_with_a_slow_store() {
    a_dropped_follower_leaves_its_leader_whole(Kind::Slow).await;
}

#[tokio::test(start_paused = true)]
async fn two_clones_of_one_request_sent_at_once_make_one_flight() {
    for kind in [Kind::Memory, Kind::Slow] {
        let s = Setup::new(kind);
        let req = weather();
        let a = s.layer.layer(s.tool()).oneshot(req.clone());
        let b = s.layer.layer(s.tool()).oneshot(req);
        let (a, b) = tokio::join!(a, b);
        assert_eq!(n_of(&a), json!(1), "{kind:?}");
        assert_eq!(n_of(&b), json!(1), "{kind:?}");
        assert_eq!(s.started.load(Ordering::SeqCst), 1, "{kind:?}: one flight");
        let counts = s.layer.handle().counts();
        assert_eq!((counts.misses, counts.coalesced), (1, 1), "{kind:?}");
    }
}
