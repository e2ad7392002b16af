//! Several OS threads, thousands of concurrent calls on one key with flapping outcomes:
//! the counters stay consistent and no more than K half-open probes ever run at once.
//! And manual overrides racing the registry's sweep: none is ever lost.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use toolshield_breaker::{
    BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState, WindowConfig,
};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::{Layer, Service, ServiceExt};

const THREADS: usize = 4;
const TASKS: usize = 250;
const CALLS_PER_TASK: usize = 8;
const K: usize = 2;

#[derive(Clone, Default)]
struct Flapping {
    calls: Arc<AtomicUsize>,
    probes_now: Arc<AtomicUsize>,
    probes_max: Arc<AtomicUsize>,
}

impl Service<ToolRequest> for Flapping {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let probe = req.state().is_probe();
        let (now, max) = (Arc::clone(&self.probes_now), Arc::clone(&self.probes_max));
        Box::pin(async move {
            if probe {
                let c = now.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(c, Ordering::SeqCst);
            }
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            if probe {
                now.fetch_sub(1, Ordering::SeqCst);
            }
            // Healthy and failing phases of 300 calls each, with noise.
            let failing = (n / 300) % 2 == 1;
            if failing || n.is_multiple_of(7) {
                Err(ToolError::new(ErrorKind::UpstreamUnavailable, "flap"))
            } else {
                Ok(ToolResponse::new(json!(null)))
            }
        })
    }
}

#[test]
fn concurrent_calls_keep_counters_consistent_and_probes_bounded() {
    let registry = BreakerRegistry::new(BreakerConfig {
        consecutive_failures: 5,
        window: WindowConfig::count(20),
        min_calls: 10,
        open_wait: Duration::from_micros(200),
        half_open_permits: K as u32,
        half_open_successes: 2,
        ..BreakerConfig::default()
    })
    .unwrap();
    let tool = Flapping::default();
    let admitted = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));

    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            let svc = BreakerLayer::new(registry.clone()).layer(tool.clone());
            let (admitted, rejected) = (Arc::clone(&admitted), Arc::clone(&rejected));
            scope.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let mut set = tokio::task::JoinSet::new();
                    for _ in 0..TASKS {
                        let mut svc = svc.clone();
                        let (admitted, rejected) = (Arc::clone(&admitted), Arc::clone(&rejected));
                        set.spawn(async move {
                            for _ in 0..CALLS_PER_TASK {
                                let r = svc
                                    .ready()
                                    .await
                                    .unwrap()
                                    .call(ToolRequest::new("hot", json!({})))
                                    .await;
                                match r {
                                    Err(e) if e.kind() == ErrorKind::CircuitOpen => {
                                        rejected.fetch_add(1, Ordering::SeqCst)
                                    }
                                    _ => admitted.fetch_add(1, Ordering::SeqCst),
                                };
                                tokio::task::yield_now().await;
                            }
                        });
                    }
                    while let Some(r) = set.join_next().await {
                        r.unwrap();
                    }
                });
            });
        }
    });

    let total = THREADS * TASKS * CALLS_PER_TASK;
    let (admitted, rejected) = (
        admitted.load(Ordering::SeqCst),
        rejected.load(Ordering::SeqCst),
    );
    assert_eq!(admitted + rejected, total);
    assert_eq!(
        tool.calls.load(Ordering::SeqCst),
        admitted,
        "every admitted call reached the tool"
    );
    assert_eq!(
        registry.rejections("hot") as usize,
        rejected,
        "the rejection counter is exact"
    );
    assert!(rejected > 0, "the breaker opened at some point");
    assert!(
        tool.probes_max.load(Ordering::SeqCst) <= K,
        "never more than K probes at once"
    );
    assert!(tool.probes_max.load(Ordering::SeqCst) >= 1, "probes ran");

    let status = registry.status("hot").unwrap();
    assert_eq!(status.probes_in_flight, 0, "no permit leaked");
    assert!(status.calls_in_window <= 20);
    assert!(status.failures_in_window <= status.calls_in_window);
    assert!((0.0..=100.0).contains(&status.failure_rate));

    // Every state entered was left, except the final one (the start is Closed).
    let counts = registry.transition_counts();
    assert!(!counts.is_empty());
    for s in [
        CircuitState::Closed,
        CircuitState::Open,
        CircuitState::HalfOpen,
    ] {
        let into: u64 = counts.iter().filter(|c| c.to == s).map(|c| c.count).sum();
        let out: u64 = counts.iter().filter(|c| c.from == s).map(|c| c.count).sum();
        let expected = i64::from(status.state == s) - i64::from(s == CircuitState::Closed);
        assert_eq!(
            into as i64 - out as i64,
            expected,
            "{s}: in {into}, out {out}, final {:?}",
            status.state
        );
    }
}

#[test]
fn an_override_racing_the_sweep_is_never_lost() {
    // One thread sweeps without pause; the other resets idle keys (closed, no override:
    // evictable) and forces them open or pins them. Each override must hold on the
    // breaker the registry keeps: a breaker evicted between the lookup and the change
    // took the override with it, and the key's next call found a fresh closed breaker.
    let registry = BreakerRegistry::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = {
        let (registry, stop) = (registry.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                registry.evict_idle();
            }
        })
    };
    let mut lost = 0;
    for i in 0..100_000 {
        let key = format!("key-{}", i % 64);
        registry.reset(&key);
        if i % 2 == 0 {
            registry.force_open(&key);
        } else {
            registry.force_closed(&key);
        }
        let expected = if i % 2 == 0 {
            CircuitState::ForcedOpen
        } else {
            CircuitState::Disabled
        };
        if registry.state(&key) != expected {
            lost += 1;
        }
        registry.reset(&key);
    }
    stop.store(true, Ordering::Relaxed);
    sweeper.join().expect("the sweeping thread");
    assert_eq!(lost, 0, "overrides lost to the sweep");
}
