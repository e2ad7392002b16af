//! tower-resilience's counterpart of the default stack, shared by the benches that
//! compare against it (`#[path = "common/peer.rs"] mod peer;`).

use std::fmt::Debug;
use std::time::Duration;

use toolshield::prelude::*;
use toolshield_benches::BareTool;
use tower::{Layer, Service};
use tower_resilience::cache::CacheLayer as PeerCache;
use tower_resilience::circuitbreaker::{CircuitBreakerError, CircuitBreakerLayer};
use tower_resilience::retry::RetryLayer as PeerRetry;
use tower_resilience::timelimiter::{TimeLimiterError, TimeLimiterLayer};

/// The error the peer's retry sees from the breaker it wraps.
type Inner = CircuitBreakerError<TimeLimiterError<ToolError>>;

/// Time limiter (30 s, cancelling) + retry (3 attempts) + circuit breaker (50 % of 100
/// calls) around the bare tool: the pipeline without a cache, as the read-only tool
/// without a cache runs in the default stack.
pub(crate) fn pipeline() -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error: Debug + Send + Sync + 'static,
    Future: Send,
> + Clone
       + Send
       + Sync
       + 'static {
    let time_limiter = TimeLimiterLayer::builder()
        .timeout_duration(Duration::from_secs(30))
        .cancel_running_future(true)
        .build();
    let breaker = CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .build()
        .expect("peer breaker");
    let retry = PeerRetry::<ToolRequest, ToolResponse, Inner>::builder()
        .max_attempts(3)
        .exponential_backoff(Duration::from_millis(500))
        .build();
    retry.layer(breaker.layer(time_limiter.layer(BareTool)))
}

/// [`pipeline`] behind tower-resilience's cache (100,000 entries, 10 min TTL, keyed by
/// the request's canonical cache key): the counterpart of a cached read-only tool.
pub(crate) fn stack() -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error: Debug + Send + Sync + 'static,
    Future: Send,
> + Clone
       + Send
       + Sync
       + 'static {
    let cache = PeerCache::builder()
        .max_size(100_000)
        .ttl(Duration::from_secs(600))
        .key_extractor(|req: &ToolRequest| req.cache_key().unwrap_or_default())
        .build()
        .expect("peer cache");
    cache.layer(pipeline())
}
