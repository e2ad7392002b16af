//! What a caller of a read-only tool is owed by the cache, from `docs/cache.md` and
//! `docs/semantics.md`: one tool run per key at a time, an answer (or its own failure)
//! for every caller that is not dropped whatever the tool and the store do, payloads
//! without a canonical form passed through, bounded memory under a flood of keys, TTLs
//! from zero to the maximum, and hits marked as hits with their original `fetched_at`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use serde_json::{json, Value};
use toolshield_cache::testing::FaultyCacheStore;
use toolshield_cache::{CacheConfig, CacheLayer, InMemoryCacheStore, MemoryBounds};
use toolshield_core::config::MAX_DURATION;
use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{BoxedTool, Rng};
use tower::{service_fn, Layer, Service, ServiceExt};

fn read(city: u64) -> ToolRequest {
    ToolRequest::new("weather", json!({ "city": city })).kind(CallKind::ReadOnly)
}

/// Tool runs in flight per city, and the most ever seen at once for one city.
#[derive(Default)]
struct InFlight {
    now: Mutex<HashMap<u64, usize>>,
    most: AtomicUsize,
}

/// Counts a run of the tool for a city as in flight until dropped.
struct Running(Arc<InFlight>, u64);

impl Running {
    fn start(book: &Arc<InFlight>, city: u64) -> Running {
        let mut now = book.now.lock().unwrap();
        let n = now.entry(city).or_default();
        *n += 1;
        book.most.fetch_max(*n, Ordering::SeqCst);
        Running(Arc::clone(book), city)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut now) = self.0.now.lock() {
            *now.entry(self.1).or_default() -= 1;
        }
    }
}

/// Polls `fut` at most `polls` times: `None` when it was dropped before it ended, as a
/// caller that gives up drops it.
async fn dropped_after<F: Future>(fut: F, polls: u64) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut left = polls;
    std::future::poll_fn(move |cx| {
        if left == 0 {
            return Poll::Ready(None);
        }
        left -= 1;
        match fut.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tool_run_per_key_at_a_time_and_every_caller_is_answered_under_panics_drops_and_store_faults(
) {
    let (mut tool_panics_seen, mut followed) = (0, 0);
    for seed in 1..=12u64 {
        let book = Arc::new(InFlight::default());
        let panics = Arc::new(AtomicUsize::new(0));
        let (tool_book, tool_panics) = (Arc::clone(&book), Arc::clone(&panics));
        let runs = Arc::new(AtomicUsize::new(0));
        let tool = BoxedTool::new(service_fn(move |req: ToolRequest| {
            let run = runs.fetch_add(1, Ordering::SeqCst) as u64;
            let city = req.payload()["city"].as_u64().unwrap_or(u64::MAX);
            let (book, panics) = (Arc::clone(&tool_book), Arc::clone(&tool_panics));
            let mut rng = Rng::from_state(seed ^ run.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let roll = rng.below(100);
            async move {
                let running = Running::start(&book, city);
                for _ in 0..(roll % 20) {
                    tokio::task::yield_now().await;
                }
                let out = match roll % 10 {
                    0 => {
                        panics.fetch_add(1, Ordering::SeqCst);
                        panic!("the tool panicked");
                    }
                    1 => Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down")),
                    _ => Ok(ToolResponse::new(json!({ "city": city }))),
                };
                drop(running);
                out
            }
        }));
        let plan = FaultPlan::new();
        plan.random(
            seed,
            0.2,
            &["get", "put"],
            &[Fault::Fail, Fault::ApplyThenFail],
        );
        let store = FaultyCacheStore::new(InMemoryCacheStore::new(), plan);
        // A TTL of a millisecond on the real clock: entries keep expiring, so flights
        // keep forming while the callers run.
        let layer = CacheLayer::with_store(
            CacheConfig::default().with_ttl(Duration::from_millis(1)),
            Arc::new(store),
        )
        .unwrap();
        let mut rng = Rng::from_state(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..400 {
            let city = rng.below(4);
            let drop_after = (rng.below(6) == 0).then(|| 1 + rng.below(10));
            let svc = layer.layer(tool.clone());
            tasks.spawn(async move {
                let call = svc.oneshot(read(city));
                let out = match drop_after {
                    Some(polls) => dropped_after(call, polls).await,
                    None => Some(call.await),
                };
                (city, out)
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(120), async {
            let mut panicked = 0;
            while let Some(joined) = tasks.join_next().await {
                match joined {
                    Err(e) if e.is_panic() => panicked += 1,
                    Err(e) => panic!("seed {seed}: task failed: {e}"),
                    Ok((_, None)) => {}
                    Ok((city, Some(Ok(r)))) => {
                        assert_eq!(r.output, json!({ "city": city }), "seed {seed}");
                    }
                    Ok((_, Some(Err(e)))) => assert_eq!(
                        e.kind(),
                        ErrorKind::UpstreamUnavailable,
                        "seed {seed}: only the tool's own failure is shared: {e}"
                    ),
                }
            }
            panicked
        })
        .await
        .unwrap_or_else(|_| panic!("seed {seed}: a caller was left waiting"));
        // A panic unwinds through the caller that ran the tool, and no other.
        assert_eq!(all, panics.load(Ordering::SeqCst), "seed {seed}");
        (tool_panics_seen, followed) = (
            tool_panics_seen + all,
            followed + layer.handle().counts().coalesced,
        );
        assert_eq!(
            book.most.load(Ordering::SeqCst),
            1,
            "seed {seed}: two runs of the tool for one key overlapped"
        );
    }
    assert!(
        tool_panics_seen > 0 && followed > 0,
        "the runs exercised panics and flights"
    );
}

#[tokio::test(start_paused = true)]
async fn a_payload_without_a_canonical_form_is_passed_through_and_never_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let tool = BoxedTool::new(service_fn(move |_req: ToolRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, ToolError>(ToolResponse::new(json!({ "n": n }))) }
    }));
    let layer = CacheLayer::new(CacheConfig::default().with_ttl(Duration::from_secs(60))).unwrap();
    let mut deep = json!(1);
    for _ in 0..=toolshield_core::canonical::MAX_DEPTH {
        deep = Value::Array(vec![deep]);
    }
    for n in 1..=2 {
        let req = ToolRequest::new("weather", deep.clone()).kind(CallKind::ReadOnly);
        let r = layer.layer(tool.clone()).oneshot(req).await.unwrap();
        assert_eq!(r.output, json!({ "n": n }), "the tool answers every call");
        assert!(!r.provenance.cache_hit);
    }
    assert_eq!(layer.handle().counts().hits, 0);
}

#[tokio::test(start_paused = true)]
async fn a_million_distinct_keys_keep_the_store_within_its_bounds() {
    let store = InMemoryCacheStore::with_config(&MemoryBounds::new(1_000, 1 << 20)).unwrap();
    let store = Arc::new(store);
    let layer = CacheLayer::with_store(
        CacheConfig::default().with_ttl(Duration::from_secs(3600)),
        Arc::clone(&store) as _,
    )
    .unwrap();
    let tool = BoxedTool::new(service_fn(|req: ToolRequest| {
        let out = req.payload().clone();
        async move { Ok::<_, ToolError>(ToolResponse::new(out)) }
    }));
    let mut svc = layer.layer(tool);
    for i in 0..1_000_000u64 {
        let r = svc.ready().await.unwrap().call(read(i)).await.unwrap();
        assert!(!r.provenance.cache_hit);
        if i % 100_000 == 99_999 {
            assert!(
                store.entries().len() <= 1_000,
                "{} entries",
                store.entries().len()
            );
            assert!(store.entries().weighted_size() <= 1 << 20);
        }
    }
    assert_eq!(layer.handle().counts().misses, 1_000_000);
    // The latest keys are still served from the cache.
    let r = svc
        .ready()
        .await
        .unwrap()
        .call(read(999_999))
        .await
        .unwrap();
    assert!(r.provenance.cache_hit);
}

#[tokio::test(start_paused = true)]
async fn ttl_zero_is_off_and_the_maximum_ttl_keeps_an_entry_fresh_for_all_of_it() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let tool = BoxedTool::new(service_fn(move |_req: ToolRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, ToolError>(ToolResponse::new(json!({ "n": n }))) }
    }));
    let off = CacheLayer::new(CacheConfig::default()).unwrap();
    for n in 1..=2 {
        let r = off.layer(tool.clone()).oneshot(read(1)).await.unwrap();
        assert_eq!(r.output, json!({ "n": n }));
        assert!(!r.provenance.cache_hit);
    }
    assert!(CacheLayer::new(
        CacheConfig::default().with_ttl(MAX_DURATION + Duration::from_millis(1))
    )
    .is_err());
    let longest = CacheLayer::new(
        CacheConfig::default()
            .with_ttl(MAX_DURATION)
            .with_stale_if_error(MAX_DURATION),
    )
    .unwrap();
    let first = longest.layer(tool.clone()).oneshot(read(2)).await.unwrap();
    assert!(!first.provenance.cache_hit);
    let fetched = first.provenance.fetched_at.expect("stamped on the miss");
    tokio::time::advance(MAX_DURATION - Duration::from_secs(1)).await;
    let hit = longest.layer(tool.clone()).oneshot(read(2)).await.unwrap();
    assert_eq!(hit.output, first.output);
    assert!(hit.provenance.cache_hit && !hit.provenance.stale);
    assert_eq!(
        hit.provenance.fetched_at,
        Some(fetched),
        "the original fetch time"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    let again = longest.layer(tool).oneshot(read(2)).await.unwrap();
    assert!(!again.provenance.cache_hit, "expired at the end of its TTL");
    assert_ne!(again.output, first.output);
}
