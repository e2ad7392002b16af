//! Fail-open logs while Redis is down, and dedupe comes back after a restart.
//!
//! Alone in its test binary: `tracing` caches whether a callsite is enabled, process-wide,
//! and another test hitting the same warning with no subscriber on its thread can race
//! this test's scoped subscriber for that decision.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{call, config, connect, counting_tool, eventually, pay, prefix, stack};
use toolshield_idempotency::OnStoreError;
use toolshield_redis::testing::private_redis;
use toolshield_redis::RedisIdempotencyStore;
use toolshield_test::LogCapture;

const OP_TIMEOUT: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "current_thread")]
async fn fail_open_runs_and_logs_while_redis_is_down_and_dedupes_again_after_restart() {
    let Some(mut redis) = private_redis(
        "fail_open_runs_and_logs_while_redis_is_down_and_dedupes_again_after_restart",
    ) else {
        return;
    };
    let logs = LogCapture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let conn = connect(&redis.url(), &prefix(), OP_TIMEOUT).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(RedisIdempotencyStore::new(conn.clone()));
    let (svc, handle) = stack(
        config(OnStoreError::FailOpen),
        store,
        counting_tool(Arc::clone(&runs), "a", Duration::ZERO),
    );

    redis.kill();
    call(&svc, pay("outage")).await.unwrap();
    call(&svc, pay("outage")).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "fail-open runs every call, without dedupe"
    );
    assert!(handle.counts().store_errors >= 2);
    assert!(
        logs.text().contains("running without dedupe"),
        "fail-open must log: {}",
        logs.text()
    );

    redis.restart().unwrap();
    eventually(Duration::from_secs(10), "reconnection", || {
        let conn = conn.clone();
        async move { conn.health().await.ok() }
    })
    .await;
    let first = call(&svc, pay("after-restart")).await.unwrap();
    let again = call(&svc, pay("after-restart")).await.unwrap();
    assert!(
        !first.provenance.replayed && again.provenance.replayed,
        "dedupe is back"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
