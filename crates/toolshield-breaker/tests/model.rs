//! Property test: random sequences of successes, failures, slow calls, client errors,
//! time advances and manual actions drive the breaker and a small reference model; both
//! must agree on admission, state and counters after every step. Once with a count
//! window, once with a time window and clock jumps of about any multiple of 65,536
//! buckets (where a 16-bit bucket tag would wrap).

use std::collections::VecDeque;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};
use toolshield_breaker::{
    BreakerConfig, BreakerLayer, BreakerRegistry, CircuitState, WindowConfig,
};
use toolshield_core::{ErrorKind, ShieldResponse, SlowCall, ToolError, ToolRequest, ToolResponse};
use tower::{Layer, Service, ServiceExt};

#[derive(Debug, Clone, Copy)]
enum Op {
    Ok,
    Fail,
    Slow,
    Client,
    Advance(u64),
    ForceOpen,
    ForceClosed,
    MetricsOnly,
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Ok),
        6 => Just(Op::Fail),
        2 => Just(Op::Slow),
        1 => Just(Op::Client),
        3 => (0u64..9_000).prop_map(Op::Advance),
        1 => Just(Op::ForceOpen),
        1 => Just(Op::ForceClosed),
        1 => Just(Op::MetricsOnly),
        1 => Just(Op::Reset),
    ]
}

/// `op()`, plus jumps of k x 65,536 time buckets, give or take a few buckets.
fn time_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op(),
        1 => (1u64..8, 0u64..(2 * JUMP_SLACK_MS))
            .prop_map(|(k, off)| Op::Advance(k * 65_536 * BUCKET_MS + off - JUMP_SLACK_MS)),
    ]
}

#[derive(Clone)]
struct Tool;

impl Service<ToolRequest> for Tool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = Ready<Result<ToolResponse, ToolError>>;
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: ToolRequest) -> Self::Future {
        ready(match req.payload()["r"].as_str() {
            Some("fail") => Err(ToolError::new(ErrorKind::ConnectionFailed, "down")),
            Some("client") => Err(ToolError::invalid_input("bad")),
            Some("slow") => {
                let mut r = ToolResponse::new(Value::Null);
                r.mark_slow(SlowCall {
                    elapsed: Duration::from_secs(3),
                    threshold: Duration::from_secs(2),
                });
                Ok(r)
            }
            _ => Ok(ToolResponse::new(Value::Null)),
        })
    }
}

const SIZE: usize = 6;
const MIN_CALLS: usize = 4;
const CONSECUTIVE: u32 = 3;
const S: u32 = 2;
/// The time window: `BUCKETS` buckets of `BUCKET_MS`.
const BUCKET_MS: u64 = 1_000;
const BUCKETS: u64 = 4;
const JUMP_SLACK_MS: u64 = 6 * BUCKET_MS;

fn config(time: bool) -> BreakerConfig {
    BreakerConfig {
        consecutive_failures: CONSECUTIVE,
        window: if time {
            WindowConfig::time(Duration::from_millis(BUCKET_MS * BUCKETS), BUCKETS as u32)
        } else {
            WindowConfig::count(SIZE as u32)
        },
        min_calls: MIN_CALLS as u32,
        failure_rate: 50.0,
        slow_call_rate: Some(75.0),
        open_wait: Duration::from_secs(5),
        open_wait_multiplier: 2.0,
        max_open_wait: Duration::from_secs(15),
        half_open_permits: 1,
        half_open_successes: S,
        ..BreakerConfig::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Normal,
    ForcedOpen,
    Disabled,
    MetricsOnly,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum St {
    Closed,
    Open,
    HalfOpen,
}

/// The reference model: plain fields, one step at a time.
#[derive(Debug)]
struct Model {
    /// A time window (else the last `SIZE` calls).
    time: bool,
    mode: Mode,
    st: St,
    /// `(time bucket, failure, slow)` of the calls recorded.
    window: VecDeque<(u64, bool, bool)>,
    consecutive: u32,
    opens: u32,
    open_until: u64,
    now: u64,
    successes: u32,
}

impl Model {
    fn new(time: bool) -> Self {
        Model {
            time,
            mode: Mode::Normal,
            st: St::Closed,
            window: VecDeque::new(),
            consecutive: 0,
            opens: 0,
            open_until: 0,
            now: 0,
            successes: 0,
        }
    }

    fn open(&mut self) {
        self.opens += 1;
        let wait = (5_000u64 << (self.opens - 1).min(10)).min(15_000);
        self.open_until = self.now + wait;
        self.st = St::Open;
    }

    /// Calls, failures and slow calls in the window now.
    fn counts(&self) -> (usize, usize, usize) {
        let now = self.now / BUCKET_MS;
        let live = self
            .window
            .iter()
            .filter(|w| !self.time || w.0 + BUCKETS > now);
        live.fold((0, 0, 0), |(c, f, s), w| {
            (c + 1, f + usize::from(w.1), s + usize::from(w.2))
        })
    }

    fn close(&mut self) {
        self.st = St::Closed;
        self.window.clear();
        self.consecutive = 0;
        self.opens = 0;
    }

    fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
        self.close();
    }

    /// Returns whether the call was admitted.
    fn call(&mut self, op: Op) -> bool {
        if self.mode == Mode::ForcedOpen {
            return false;
        }
        if self.st == St::Open {
            if self.now >= self.open_until {
                self.st = St::HalfOpen;
                self.successes = 0;
            } else {
                return self.mode == Mode::MetricsOnly;
            }
        }
        let (failure, slow) = match op {
            Op::Ok => (false, false),
            Op::Fail => (true, false),
            Op::Slow => (false, true),
            _ => return true,
        };
        if self.st == St::HalfOpen {
            if failure || slow {
                self.open();
            } else {
                self.successes += 1;
                if self.successes >= S {
                    self.close();
                }
            }
            return true;
        }
        if failure {
            self.consecutive += 1;
        } else {
            self.consecutive = 0;
        }
        self.window.push_back((self.now / BUCKET_MS, failure, slow));
        if !self.time && self.window.len() > SIZE {
            self.window.pop_front();
        }
        if self.mode == Mode::Disabled {
            return true;
        }
        let (calls, fails, slows) = self.counts();
        if (failure && self.consecutive >= CONSECUTIVE)
            || (calls >= MIN_CALLS && fails > 0 && fails * 100 >= 50 * calls)
            || (calls >= MIN_CALLS && slows > 0 && slows * 100 >= 75 * calls)
        {
            self.open();
        }
        true
    }

    fn state(&self) -> (CircuitState, Option<CircuitState>) {
        let auto = match self.st {
            St::Closed => CircuitState::Closed,
            St::Open => CircuitState::Open,
            St::HalfOpen => CircuitState::HalfOpen,
        };
        match self.mode {
            Mode::Normal => (auto, None),
            Mode::ForcedOpen => (CircuitState::ForcedOpen, None),
            Mode::Disabled => (CircuitState::Disabled, None),
            Mode::MetricsOnly => (CircuitState::MetricsOnly, Some(auto)),
        }
    }
}

fn check(ops: Vec<Op>, time: bool) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let registry = BreakerRegistry::new(config(time)).unwrap();
        let mut svc = BreakerLayer::new(registry.clone()).layer(Tool);
        let mut model = Model::new(time);
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Advance(ms) => {
                    tokio::time::advance(Duration::from_millis(ms)).await;
                    model.now += ms;
                }
                Op::ForceOpen => {
                    registry.force_open("t");
                    model.set_mode(Mode::ForcedOpen);
                }
                Op::ForceClosed => {
                    registry.force_closed("t");
                    model.set_mode(Mode::Disabled);
                }
                Op::MetricsOnly => {
                    registry.metrics_only("t");
                    model.set_mode(Mode::MetricsOnly);
                }
                Op::Reset => {
                    registry.reset("t");
                    model.set_mode(Mode::Normal);
                }
                Op::Ok | Op::Fail | Op::Slow | Op::Client => {
                    let r = match op {
                        Op::Ok => "ok",
                        Op::Fail => "fail",
                        Op::Slow => "slow",
                        _ => "client",
                    };
                    let result = svc
                        .ready()
                        .await
                        .unwrap()
                        .call(ToolRequest::new("t", json!({ "r": r })))
                        .await;
                    let rejected = matches!(&result, Err(e) if e.kind() == ErrorKind::CircuitOpen);
                    let admitted = model.call(op);
                    prop_assert_eq!(
                        !rejected,
                        admitted,
                        "step {}: {:?}, model {:?}",
                        i,
                        op,
                        model
                    );
                }
            }
            let status = registry.status("t");
            let (state, shadow) = model.state();
            let (got_state, got_shadow) = status
                .as_ref()
                .map_or((CircuitState::Closed, None), |s| (s.state, s.shadow_state));
            prop_assert_eq!(
                (got_state, got_shadow),
                (state, shadow),
                "step {}: {:?}, model {:?}",
                i,
                op,
                model
            );
            if let Some(s) = status {
                prop_assert_eq!(s.consecutive_failures, model.consecutive, "step {}", i);
                if model.st == St::Closed {
                    let (calls, fails, _) = model.counts();
                    prop_assert_eq!(s.calls_in_window as usize, calls, "step {}", i);
                    prop_assert_eq!(s.failures_in_window as usize, fails, "step {}", i);
                }
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn breaker_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..120)) {
        check(ops, false)?;
    }

    #[test]
    fn time_window_breaker_matches_the_reference_model_across_clock_jumps(
        ops in proptest::collection::vec(time_op(), 1..120),
    ) {
        check(ops, true)?;
    }
}
