//! Randomized single-flight runs under store faults, leaders dropped at random points,
//! deadlines, per-caller refusals and stale entries, checked against the invariants every
//! caller is owed:
//!
//! - a caller that is not dropped is always answered, by its deadline when it has one
//!   (plus the store's own delays);
//! - a refusal keyed by caller (`RATE_LIMITED`, `UNAUTHORIZED`) reaches only the caller
//!   refused; `TIMEOUT` reaches only a caller with a deadline; `CANCELLED` reaches nobody;
//! - an answer is for the request's own payload and, per user, its own caller;
//! - `stale` is only ever set on a cache hit, and never reaches a caller whose own call
//!   was never refused while the upstream answered everyone else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, timeout, Instant};
use toolshield_cache::testing::FaultyCacheStore;
use toolshield_cache::{CacheConfig, CacheLayer, InMemoryCacheStore};
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{BoxedTool, Rng};
use tower::{service_fn, Layer, ServiceExt};

/// The caller whose quota and credentials are refused; every other caller is served.
const REFUSED: &str = "mallory";

/// A tool answering `{city, caller, n}` after a while; `mallory` is refused with a
/// caller's own refusal. Other calls fail for everyone now and then (`UPSTREAM_UNAVAILABLE`,
/// shared), or run long and are cut with `TIMEOUT` at the request's deadline, as the
/// attempt timeout inside cuts them.
fn tool(seed: u64) -> BoxedTool {
    let calls = Arc::new(AtomicU64::new(0));
    BoxedTool::new(service_fn(move |req: ToolRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let mut rng = Rng::from_state(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let caller = req.meta().caller_id.as_deref().map(str::to_owned);
        let city = req.payload()["city"].clone();
        let deadline = req.deadline_at();
        let roll = rng.below(100);
        let took = Duration::from_millis(100 + rng.below(2_000));
        async move {
            let long = roll >= 85;
            let work = sleep(if long { took * 5 } else { took });
            match deadline {
                Some(at) => tokio::select! {
                    _ = work => {}
                    _ = tokio::time::sleep_until(at) => {
                        return Err(ToolError::timeout("call reached its deadline"));
                    }
                },
                None => work.await,
            }
            if caller.as_deref() == Some(REFUSED) {
                let kind = if roll.is_multiple_of(2) {
                    ErrorKind::RateLimited
                } else {
                    ErrorKind::Unauthorized
                };
                return Err(ToolError::new(kind, "refused for this caller"));
            }
            if roll < 15 {
                return Err(ToolError::new(
                    ErrorKind::UpstreamUnavailable,
                    "upstream down",
                ));
            }
            Ok(ToolResponse::new(
                json!({"city": city, "caller": caller, "n": n}),
            ))
        }
    }))
}

#[derive(Debug)]
struct Call {
    city: u64,
    caller: Option<&'static str>,
    deadline: Option<Duration>,
    dropped_after: Option<Duration>,
}

#[tokio::test(start_paused = true)]
async fn callers_get_only_their_own_outcomes_under_random_flights_and_faults() {
    const CALLERS: [Option<&str>; 4] = [Some("alice"), Some("bob"), Some(REFUSED), None];
    for seed in 1..=60u64 {
        let mut rng = Rng::from_state(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let plan = FaultPlan::new();
        plan.random(
            seed,
            0.2,
            &["get", "put"],
            &[
                Fault::Fail,
                Fault::ApplyThenFail,
                Fault::Delay(Duration::from_millis(300)),
                Fault::ApplyLater(Duration::from_millis(200)),
            ],
        );
        let store = FaultyCacheStore::new(InMemoryCacheStore::new(), plan);
        let per_user = seed.is_multiple_of(2);
        let layer = CacheLayer::with_store(
            CacheConfig::default()
                .with_ttl(Duration::from_secs(2))
                .with_stale_if_error(Duration::from_secs(4))
                .with_per_user(per_user),
            Arc::new(store),
        )
        .expect("valid config");
        let svc = tool(seed);
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..40 {
            let call = Call {
                city: rng.below(2),
                caller: CALLERS[rng.below(4) as usize],
                deadline: (rng.below(3) == 0)
                    .then(|| Duration::from_millis(200 + rng.below(3_000))),
                dropped_after: (rng.below(5) == 0).then(|| Duration::from_millis(rng.below(2_000))),
            };
            let begin = start + Duration::from_millis(rng.below(12_000));
            let mut req =
                ToolRequest::new("weather", json!({"city": call.city})).kind(CallKind::ReadOnly);
            if let Some(c) = call.caller {
                req = req.caller(c);
            }
            let svc = layer.layer(svc.clone());
            tasks.spawn(async move {
                tokio::time::sleep_until(begin).await;
                let req = match call.deadline {
                    Some(d) => req.deadline(Instant::now() + d),
                    None => req,
                };
                let began = Instant::now();
                let fut = svc.oneshot(req);
                let out = match call.dropped_after {
                    Some(d) => match timeout(d, fut).await {
                        Ok(r) => Some(r),
                        Err(_) => return (call, None, Duration::ZERO),
                    },
                    // No call may wait an hour: 40 calls of at most 10 s each.
                    None => Some(
                        timeout(Duration::from_secs(3600), fut)
                            .await
                            .unwrap_or_else(|_| panic!("seed {seed}: a call never ended")),
                    ),
                };
                (call, out, began.elapsed())
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let (call, out, took) = joined.expect("no task panics");
            let Some(out) = out else { continue };
            if let Some(d) = call.deadline {
                // A store write or read may each add its 300 ms delay; a wait for another
                // caller's flight adds nothing.
                assert!(
                    took <= d + Duration::from_millis(600),
                    "seed {seed}: {call:?} answered {took:?} after it began"
                );
            }
            match out {
                Ok(r) => {
                    assert_eq!(
                        r.output["city"],
                        json!(call.city),
                        "seed {seed}: {call:?} got another payload's answer"
                    );
                    if per_user {
                        assert_eq!(
                            r.output["caller"],
                            json!(call.caller),
                            "seed {seed}: {call:?} got another caller's per-user answer"
                        );
                    }
                    if r.provenance.stale {
                        assert!(r.provenance.cache_hit, "seed {seed}: stale is a hit");
                    }
                }
                Err(e) => match e.kind() {
                    ErrorKind::RateLimited | ErrorKind::Unauthorized => assert_eq!(
                        call.caller,
                        Some(REFUSED),
                        "seed {seed}: {call:?} got another caller's refusal {e}"
                    ),
                    ErrorKind::Timeout => assert!(
                        call.deadline.is_some(),
                        "seed {seed}: {call:?} without a deadline timed out: {e}"
                    ),
                    ErrorKind::UpstreamUnavailable => {}
                    other => panic!("seed {seed}: {call:?} got {other:?}: {e}"),
                },
            }
        }
    }
}
