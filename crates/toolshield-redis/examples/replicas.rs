//! Two replicas of one agent share a Redis: a payment sent through replica A is replayed,
//! not charged again, when the same request reaches replica B.
//!
//! `cargo run -p toolshield-redis --example replicas` (uses `TOOLSHIELD_REDIS_URL`, else
//! starts a private `redis-server`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolshield_core::{CallKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer};
use toolshield_redis::testing::RedisServer;
use toolshield_redis::{RedisConfig, RedisConnection, RedisIdempotencyStore};
use tower::{service_fn, Layer, ServiceExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = match std::env::var("TOOLSHIELD_REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => match RedisServer::start() {
            Ok(s) => (s.url(), Some(s)),
            Err(e) => {
                println!("no Redis to show replicas with ({e}); set TOOLSHIELD_REDIS_URL");
                return Ok(());
            }
        },
    };
    let charges = Arc::new(AtomicU32::new(0));
    let mut replicas = Vec::new();
    for _ in 0..2 {
        // Each replica has its own connection, as separate processes would.
        let conn = RedisConnection::connect(RedisConfig::from_url(url.clone())).await?;
        let store = Arc::new(RedisIdempotencyStore::new(conn));
        let layer = IdempotencyLayer::with_store(IdempotencyConfig::default(), store)?;
        let charges = Arc::clone(&charges);
        replicas.push(
            layer.layer(service_fn(move |_req: ToolRequest| {
                let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    Ok::<_, ToolError>(ToolResponse::new(json!({"charge": format!("ch_{n}")})))
                }
            })),
        );
    }
    let key = format!("order-{}", std::process::id());
    let pay = ToolRequest::new("pay", json!({"amount": 42}))
        .kind(CallKind::Mutating)
        .idempotency_key(key);
    let a = replicas[0].clone().oneshot(pay.clone()).await?;
    println!("replica A: charged the card ({})", a.output["charge"]);
    let b = replicas[1].clone().oneshot(pay).await?;
    println!(
        "replica B: same request, {} ({}); the card was charged {} time(s) in all",
        if b.provenance.replayed {
            "replayed the result from Redis instead of charging again"
        } else {
            "charged AGAIN"
        },
        b.output["charge"],
        charges.load(Ordering::SeqCst)
    );
    Ok(())
}
