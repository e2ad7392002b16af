//! Randomized interleavings of calls held in flight across transitions, overrides and
//! clock advances, with a checker of invariants after every step: no more half-open
//! probes run at once than permitted, a call only moves the breaker from the phase it was
//! admitted in (a result from before a transition, a reset or an override moves nothing),
//! a dropped call moves nothing, and an open breaker admits nothing before its wait.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde_json::json;
use tokio::sync::oneshot;
use toolshield_breaker::{
    BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState, TransitionReason, WindowConfig,
};
use toolshield_core::{ErrorKind, ShieldResponse, SlowCall, ToolError, ToolRequest, ToolResponse};
use toolshield_test::Rng;
use tower::{Layer, Service};

type BoxFut = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

/// The events seen: from, to, reason, and whether a metrics-only breaker's shadow moved.
type Seen = Arc<Mutex<Vec<(CircuitState, CircuitState, TransitionReason, bool)>>>;

/// What a call ends with, sent to it when the test finishes it.
#[derive(Debug, Clone, Copy)]
enum End {
    Ok,
    Fail,
    Slow,
    Client,
    /// The tool's future panics; the panic is caught around the poll and the call dropped.
    Panic,
}

/// A tool whose calls wait for the test to tell them how to end; counts the probes
/// running at once.
#[derive(Clone, Default)]
struct Held {
    ends: Arc<Mutex<HashMap<u64, oneshot::Receiver<End>>>>,
    probes: Arc<Mutex<HashMap<u64, bool>>>,
    live_probes: Arc<AtomicUsize>,
    most_probes: Arc<AtomicUsize>,
}

/// Takes a running probe off the count when its future ends or is dropped.
struct LiveProbe(Option<Arc<AtomicUsize>>);

impl Drop for LiveProbe {
    fn drop(&mut self) {
        if let Some(live) = &self.0 {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Service<ToolRequest> for Held {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = BoxFut;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> BoxFut {
        let id = req.payload()["id"].as_u64().expect("id");
        let probe = req.state().is_probe();
        self.probes.lock().unwrap().insert(id, probe);
        let live = probe.then(|| {
            let n = self.live_probes.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_probes.fetch_max(n, Ordering::SeqCst);
            Arc::clone(&self.live_probes)
        });
        let end = self.ends.lock().unwrap().remove(&id).expect("an end");
        Box::pin(async move {
            let _live = LiveProbe(live);
            match end.await {
                Ok(End::Ok) => Ok(ToolResponse::new(json!(1))),
                Ok(End::Slow) => {
                    let mut res = ToolResponse::new(json!(1));
                    res.mark_slow(SlowCall {
                        elapsed: Duration::from_secs(3),
                        threshold: Duration::from_secs(2),
                    });
                    Ok(res)
                }
                Ok(End::Fail) | Err(_) => {
                    Err(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
                }
                Ok(End::Client) => Err(ToolError::invalid_input("bad")),
                Ok(End::Panic) => panic!("the tool panicked"),
            }
        })
    }
}

fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// A call in flight: its future, the way to end it, and the phase (events seen so far)
/// it was admitted in.
struct InFlight {
    id: u64,
    fut: BoxFut,
    end: oneshot::Sender<End>,
    phase: usize,
}

async fn run(seed: u64) {
    let mut rng = Rng::new(seed);
    let permits = 1 + rng.below(3) as u32;
    let config = BreakerConfig {
        consecutive_failures: 2,
        window: WindowConfig::count(4),
        min_calls: 3,
        failure_rate: 50.0,
        slow_call_rate: Some(100.0),
        open_wait: Duration::from_secs(10),
        half_open_permits: permits,
        half_open_successes: 1 + rng.below(2) as u32,
        ..BreakerConfig::default()
    };
    let layer = BreakerLayer::from_config(&config).expect("valid");
    let registry: BreakerRegistry = layer.registry().clone();
    let events: Seen = Arc::default();
    let sink = Arc::clone(&events);
    registry.on_event(move |e| {
        sink.lock()
            .unwrap()
            .push((e.from, e.to, e.reason, e.shadow))
    });
    let tool = Held::default();
    let mut svc = layer.layer(tool.clone());
    let seen = || events.lock().unwrap().len();
    let mut flying: Vec<InFlight> = Vec::new();
    let mut next = 0u64;
    for step in 0..200 {
        let at = format!("seed {seed} step {step}");
        match rng.below(10) {
            0..=3 => {
                next += 1;
                let (tx, rx) = oneshot::channel();
                tool.ends.lock().unwrap().insert(next, rx);
                let state = registry.state("k");
                let mut fut: BoxFut =
                    Box::pin(svc.call(ToolRequest::new("k", json!({ "id": next }))));
                let phase = seen();
                match poll_once(fut.as_mut()) {
                    Poll::Pending => flying.push(InFlight {
                        id: next,
                        fut,
                        end: tx,
                        phase,
                    }),
                    Poll::Ready(Err(e)) => {
                        assert_eq!(e.kind(), ErrorKind::CircuitOpen, "{at}");
                        assert!(
                            matches!(
                                state,
                                CircuitState::Open
                                    | CircuitState::HalfOpen
                                    | CircuitState::ForcedOpen
                            ),
                            "{at}: rejected while {state:?}"
                        );
                    }
                    Poll::Ready(Ok(_)) => panic!("{at}: a held call answered before its end"),
                }
            }
            4..=6 if !flying.is_empty() => {
                let i = rng.below(flying.len() as u64) as usize;
                let mut call = flying.swap_remove(i);
                let end =
                    [End::Ok, End::Fail, End::Slow, End::Client, End::Panic][rng.below(5) as usize];
                let _ = call.end.send(end);
                let before = seen();
                let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    poll_once(call.fut.as_mut())
                }));
                match polled {
                    Ok(Poll::Ready(_)) => {}
                    Ok(Poll::Pending) => panic!("{at}: a call told to end did not"),
                    Err(_) => {
                        assert!(matches!(end, End::Panic), "{at}");
                        drop(call.fut);
                        assert_eq!(seen(), before, "{at}: a panicking call moved the breaker");
                        continue;
                    }
                }
                let new: Vec<_> = events.lock().unwrap()[before..].to_vec();
                let probe = tool.probes.lock().unwrap()[&call.id];
                if probe && call.phase == before {
                    // A probe of the current phase decides it on a failure or a slow success.
                    let expected = match end {
                        End::Fail => Some(TransitionReason::ProbeFailed),
                        End::Slow => Some(TransitionReason::ProbeSlow),
                        End::Ok | End::Client | End::Panic => None,
                    };
                    if let Some(reason) = expected {
                        assert_eq!(
                            new.iter()
                                .map(|(f, t, r, _)| (*f, *t, *r))
                                .collect::<Vec<_>>(),
                            [(CircuitState::HalfOpen, CircuitState::Open, reason)],
                            "{at}: probe {} ended {end:?}",
                            call.id
                        );
                    }
                }
                if !new.is_empty() {
                    assert_eq!(
                        call.phase, before,
                        "{at}: call {} admitted in phase {} moved the breaker in phase {before} ({end:?}, probe {probe}): {new:?}",
                        call.id, call.phase
                    );
                    // A metrics-only breaker's shadow half-open decides on every call, with no
                    // permit: its calls are not marked as probes.
                    let from = if probe {
                        CircuitState::HalfOpen
                    } else {
                        CircuitState::Closed
                    };
                    assert!(
                        new.iter().all(|(f, _, _, shadow)| *f == from
                            || *shadow && *f == CircuitState::HalfOpen),
                        "{at}: {new:?} by {end:?}, probe {probe}"
                    );
                    assert!(
                        !matches!(end, End::Client | End::Panic),
                        "{at}: an ignored outcome moved the breaker: {new:?}"
                    );
                }
            }
            7 if !flying.is_empty() => {
                let i = rng.below(flying.len() as u64) as usize;
                let before = seen();
                drop(flying.swap_remove(i));
                assert_eq!(seen(), before, "{at}: a dropped call moved the breaker");
            }
            8 => tokio::time::advance(Duration::from_secs(rng.below(12))).await,
            _ => match rng.below(6) {
                0 => registry.reset("k"),
                1 => registry.force_open("k"),
                2 => registry.force_closed("k"),
                3 => registry.metrics_only("k"),
                _ => {}
            },
        }
        let most = tool.most_probes.load(Ordering::SeqCst);
        assert!(
            most <= permits as usize,
            "{at}: {most} probes at once, {permits} permitted"
        );
        let status = registry.status("k");
        if let Some(status) = status {
            assert!(status.probes_in_flight <= permits, "{at}: {status:?}");
        }
    }
    drop(flying);
    let status = registry.status("k").expect("held");
    assert_eq!(
        status.probes_in_flight, 0,
        "seed {seed}: permits left behind: {status:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn calls_in_flight_across_transitions_move_only_their_own_phase() {
    for seed in 1..400 {
        run(seed).await;
    }
}
