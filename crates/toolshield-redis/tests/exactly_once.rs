//! Cross-process exactly-once: independent stacks, each with its own Redis client, share one
//! Redis; 1,000 concurrent duplicates of one mutating call run the tool once.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{connect, counting_tool, pay, prefix, stack};
use toolshield_idempotency::{IdempotencyConfig, OnPending};
use toolshield_redis::testing::test_redis;
use toolshield_redis::RedisIdempotencyStore;
use tower::ServiceExt;

const STACKS: usize = 4;
const CALLS: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_duplicates_over_four_stacks_run_the_tool_once() {
    let Some(redis) = test_redis("a_thousand_duplicates_over_four_stacks_run_the_tool_once") else {
        return;
    };
    let url = redis.url();
    let prefix = prefix();
    let runs = Arc::new(AtomicUsize::new(0));
    let config = IdempotencyConfig {
        on_pending: OnPending::Wait,
        lease: Duration::from_secs(5),
        wait_timeout: Duration::from_secs(20),
        poll_interval: Duration::from_millis(20),
        ..IdempotencyConfig::default()
    };
    let mut stacks = Vec::new();
    for _ in 0..STACKS {
        // A separate client per stack, as separate processes would have.
        let conn = connect(&url, &prefix, Duration::from_secs(2)).await;
        let store = Arc::new(RedisIdempotencyStore::new(conn));
        let tool = counting_tool(Arc::clone(&runs), "stack", Duration::from_millis(200));
        stacks.push(stack(config.clone(), store, tool));
    }

    let mut set = tokio::task::JoinSet::new();
    for i in 0..CALLS {
        let svc = stacks[i % STACKS].0.clone();
        set.spawn(svc.oneshot(pay("order-1000")));
    }
    let mut outputs = Vec::with_capacity(CALLS);
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(resp)) => outputs.push(resp.output),
            Ok(Err(e)) => panic!("a duplicate failed: {e}"),
            Err(e) => panic!("a caller task died: {e}"),
        }
    }

    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the tool must run exactly once"
    );
    assert_eq!(outputs.len(), CALLS);
    assert!(
        outputs.iter().all(|o| *o == outputs[0]),
        "every caller must get the same result"
    );
    let executions: u64 = stacks.iter().map(|(_, h)| h.counts().executions).sum();
    let replays: u64 = stacks.iter().map(|(_, h)| h.counts().replays).sum();
    assert_eq!(executions, 1);
    assert_eq!(
        replays,
        (CALLS - 1) as u64,
        "every other caller got a replay"
    );
}
