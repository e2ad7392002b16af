//! Redis killed and started again: once the server answers, the next command through a
//! connection that saw the outage is answered. The connection's reconnection attempts
//! during the outage all failed, so the client holds a failed connection when the first
//! command after the restart comes; that command was never sent (there was no
//! connection to send it on), so it is sent once more on the connection made anew,
//! rather than failing as `STORE_UNAVAILABLE` against a healthy server.
//!
//! Real time, not tokio's paused clock: a real redis-server process is killed and
//! restarted, and the client's reconnection backoff runs on real sockets.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{call, config, connect, counting_tool, pay, prefix, stack};
use toolshield_core::ErrorKind;
use toolshield_idempotency::OnStoreError;
use toolshield_redis::testing::private_redis;
use toolshield_redis::RedisIdempotencyStore;

const OP_TIMEOUT: Duration = Duration::from_millis(400);

/// Kills `redis`, lets every reconnection attempt of `conn` fail, and starts it again.
async fn outage_long_enough_to_fail_every_reconnection(
    redis: &mut toolshield_redis::testing::RedisServer,
    conn: &toolshield_redis::RedisConnection,
) {
    redis.kill();
    assert!(conn.health().await.is_err(), "the outage is seen");
    // The client's reconnection (3 attempts, 10 ms doubling) gives up within well under
    // this; its failed connection is what the next command finds.
    tokio::time::sleep(Duration::from_millis(600)).await;
    redis.restart().expect("redis-server starts again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_after_the_restart_is_answered_at_once() {
    let Some(mut redis) = private_redis("a_health_check_after_the_restart_is_answered_at_once")
    else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    conn.health()
        .await
        .expect("redis answers before the outage");
    outage_long_enough_to_fail_every_reconnection(&mut redis, &conn).await;
    // `restart` returned once the server answered PING on a connection of its own.
    conn.health()
        .await
        .expect("the first command after the restart is answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_the_restart_runs_under_fail_closed() {
    let Some(mut redis) = private_redis("the_first_call_after_the_restart_runs_under_fail_closed")
    else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(RedisIdempotencyStore::new(conn.clone()));
    let (svc, _handle) = stack(
        config(OnStoreError::FailClosed),
        store,
        counting_tool(Arc::clone(&runs), "a", Duration::ZERO),
    );
    call(&svc, pay("before")).await.unwrap();
    redis.kill();
    let err = call(&svc, pay("during")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreUnavailable, "{err}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    redis.restart().expect("redis-server starts again");
    call(&svc, pay("after"))
        .await
        .expect("the first call after the restart runs");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "before and after ran, once each"
    );
}
