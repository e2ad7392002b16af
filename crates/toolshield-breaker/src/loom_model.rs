//! The breaker's state machine under loom's model checker: every interleaving of the
//! atomics (and the transition lock) of two or three callers, checked against the
//! properties the breaker promises.
//!
//! Built only with `--cfg toolshield_loom`:
//!
//! ```text
//! RUSTFLAGS="--cfg toolshield_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p toolshield-breaker --lib --release loom
//! ```
//!
//! Properties (Resilience4j checks the same ones of its breaker with Lincheck):
//! - no more than `half_open_permits` probes ever run at once;
//! - a probe dropped before its outcome frees its permit;
//! - no transition is lost or made twice: concurrent trips open the breaker once, and
//!   the transition counts always describe the path to the state the breaker is in;
//! - a manual override is never undone by an automatic transition racing it.

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use toolshield_contract::{ErrorKind, Failure, Outcome};

use crate::config::BreakerConfig;
use crate::events::{CircuitState, EventHub};
use crate::future::CallGuard;
use crate::state::{BreakerState, Core, Override, Record, Ticket, TicketKind};

fn breaker(consecutive: u32, permits: u32, successes: u32) -> Arc<BreakerState> {
    let config = BreakerConfig {
        consecutive_failures: consecutive,
        open_wait: Duration::ZERO,
        half_open_permits: permits,
        half_open_successes: successes,
        ..BreakerConfig::default()
    };
    let core = Arc::new(Core::new(config, EventHub::new(None)));
    Arc::new(BreakerState::new(Arc::from("tool"), core, true))
}

/// Trips a fresh breaker (one failure, `consecutive_failures = 1`): open, with a zero
/// wait, so the next admission moves it to half-open.
fn tripped(permits: u32, successes: u32) -> Arc<BreakerState> {
    let b = breaker(1, permits, successes);
    let ticket = b.admit().expect("a fresh breaker admits");
    b.record(ticket, Record::Failure { slow: false });
    assert_eq!(b.state(), CircuitState::Open);
    b
}

/// The state the transition counts lead to from `Closed`, or a panic if they cannot be
/// one path from there (a transition lost or counted twice). A path leaves every state
/// as often as it enters it, except that it leaves `Closed` once more and enters its end
/// once more (none of that when it ends where it began).
fn state_by_counts(b: &BreakerState) -> CircuitState {
    let counts = b.transition_counts();
    let balance = |state: CircuitState| -> i64 {
        counts.iter().fold(0, |acc, &(from, to, n)| {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            acc + if to == state { n } else { 0 } - if from == state { n } else { 0 }
        })
    };
    let ends: Vec<CircuitState> = CircuitState::ALL
        .into_iter()
        .filter(|&s| balance(s) == 1)
        .collect();
    let end = match ends.as_slice() {
        [] => CircuitState::Closed,
        [one] => *one,
        more => panic!("counts end in {more:?}: {counts:?}"),
    };
    for state in CircuitState::ALL {
        let expected = match (state == CircuitState::Closed, state == end) {
            (true, true) | (false, false) => 0,
            (true, false) => -1,
            (false, true) => 1,
        };
        assert_eq!(
            balance(state),
            expected,
            "transition counts that are not a path from closed: {counts:?}"
        );
    }
    end
}

/// What one caller does with an admitted probe.
#[derive(Clone, Copy)]
enum Then {
    Succeed,
    Fail,
    Drop,
}

/// Admits one call; a probe is counted in `running` while it runs, and the count checked
/// against `permits`.
fn call(b: &Arc<BreakerState>, running: &AtomicUsize, permits: usize, then: Then) {
    let Ok(ticket) = b.admit() else { return };
    let probe = ticket.kind == TicketKind::Probe;
    if probe {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(
            now <= permits,
            "{now} probes running with {permits} permits"
        );
    }
    let mut guard = CallGuard::new(Arc::clone(b), ticket);
    if probe {
        // Counted out before the outcome frees the permit, so `running` never lags.
        running.fetch_sub(1, Ordering::SeqCst);
    }
    match then {
        Then::Succeed => guard.finish(Outcome::Success, false),
        Then::Fail => guard.finish(
            Outcome::Failure(Failure::of_kind(ErrorKind::UpstreamUnavailable)),
            false,
        ),
        Then::Drop => drop(guard),
    }
}

fn probes_in_flight(b: &BreakerState) -> u32 {
    b.status().probes_in_flight
}

fn run_callers(b: &Arc<BreakerState>, permits: usize, plans: &[Then]) {
    let running = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = plans
        .iter()
        .map(|&then| {
            let b = Arc::clone(b);
            let running = Arc::clone(&running);
            thread::spawn(move || call(&b, &running, permits, then))
        })
        .collect();
    for h in handles {
        h.join().expect("caller");
    }
}

#[test]
fn loom_one_permit_admits_one_probe_at_a_time() {
    loom::model(|| {
        let b = tripped(1, 1);
        run_callers(&b, 1, &[Then::Succeed, Then::Succeed]);
        assert_eq!(probes_in_flight(&b), 0, "every permit given back");
        let end = b.state();
        assert!(
            matches!(end, CircuitState::Closed | CircuitState::HalfOpen),
            "probes that succeed never open it: {end:?}"
        );
        assert_eq!(state_by_counts(&b), end);
    });
}

#[test]
fn loom_two_permits_never_three_probes() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let b = tripped(2, 3);
        run_callers(&b, 2, &[Then::Succeed, Then::Drop, Then::Succeed]);
        assert_eq!(probes_in_flight(&b), 0, "every permit given back");
        assert_eq!(state_by_counts(&b), b.state());
    });
}

#[test]
fn loom_a_dropped_probe_frees_its_permit() {
    loom::model(|| {
        let b = tripped(1, 1);
        run_callers(&b, 1, &[Then::Drop, Then::Drop]);
        assert_eq!(probes_in_flight(&b), 0);
        assert_eq!(
            b.state(),
            CircuitState::HalfOpen,
            "a dropped probe records nothing"
        );
        // The permit is free: the next caller probes, and its success closes the breaker.
        let ticket = b.admit().expect("the permit is free again");
        assert_eq!(ticket.kind, TicketKind::Probe);
        b.record(ticket, Record::Success { slow: false });
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(state_by_counts(&b), CircuitState::Closed);
    });
}

#[test]
fn loom_a_failed_probe_reopens_whatever_the_other_probe_does() {
    loom::model(|| {
        // Two permits, two successes needed: the failure decides, in any order.
        let b = tripped(2, 2);
        run_callers(&b, 2, &[Then::Succeed, Then::Fail]);
        assert_eq!(probes_in_flight(&b), 0);
        let end = b.state();
        assert_eq!(state_by_counts(&b), end);
        // One success of the two needed never closes it. The failure re-opens it; a
        // caller admitted after that may find it half-open again.
        assert_ne!(end, CircuitState::Closed);
    });
}

#[test]
fn loom_two_successful_probes_close_it_once() {
    loom::model(|| {
        let b = tripped(2, 2);
        // Move to half-open first, so both callers can hold a permit.
        let first = b.admit().expect("the wait is over");
        assert_eq!(first.kind, TicketKind::Probe);
        b.release_permit(first.epoch);
        run_callers(&b, 2, &[Then::Succeed, Then::Succeed]);
        assert_eq!(probes_in_flight(&b), 0);
        assert_eq!(b.state(), CircuitState::Closed, "two successes close it");
        assert_eq!(state_by_counts(&b), CircuitState::Closed);
        let closes = b
            .transition_counts()
            .iter()
            .filter(|(f, t, _)| *f == CircuitState::HalfOpen && *t == CircuitState::Closed)
            .map(|(_, _, n)| *n)
            .sum::<u64>();
        assert_eq!(closes, 1, "closed exactly once");
    });
}

#[test]
fn loom_concurrent_failures_trip_it_once() {
    loom::model(|| {
        let b = breaker(2, 1, 1);
        let tickets: Vec<Ticket> = (0..2).map(|_| b.admit().expect("closed")).collect();
        let handles: Vec<_> = tickets
            .into_iter()
            .map(|ticket| {
                let b = Arc::clone(&b);
                thread::spawn(move || b.record(ticket, Record::Failure { slow: false }))
            })
            .collect();
        for h in handles {
            h.join().expect("caller");
        }
        assert_eq!(
            b.state(),
            CircuitState::Open,
            "two failures in a row, never lost"
        );
        assert_eq!(
            b.transition_counts(),
            vec![(CircuitState::Closed, CircuitState::Open, 1)]
        );
    });
}

#[test]
fn loom_an_override_is_never_undone_by_a_racing_trip() {
    loom::model(|| {
        let b = breaker(1, 1, 1);
        let ticket = b.admit().expect("closed");
        let tripper = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.record(ticket, Record::Failure { slow: false }))
        };
        let operator = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.set_mode(Override::ForceOpen))
        };
        tripper.join().expect("tripper");
        operator.join().expect("operator");
        assert_eq!(b.state(), CircuitState::ForcedOpen);
        assert_eq!(state_by_counts(&b), CircuitState::ForcedOpen);
        assert!(b.admit().is_err(), "forced open rejects");
    });
}

#[test]
fn loom_a_late_outcome_of_a_past_phase_moves_nothing() {
    loom::model(|| {
        // Two probes of one half-open phase: one fails and re-opens the breaker; the
        // other's failure arrives late, while a new phase runs its own probe.
        let b = tripped(2, 1);
        let late = b.admit().expect("the wait is over");
        let failed = b.admit().expect("a second permit");
        assert_eq!(
            (late.kind, failed.kind),
            (TicketKind::Probe, TicketKind::Probe)
        );
        b.record(failed, Record::Failure { slow: false });
        assert_eq!(b.state(), CircuitState::Open);
        let stale = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.record(late, Record::Failure { slow: false }))
        };
        let fresh = {
            let b = Arc::clone(&b);
            thread::spawn(move || {
                let ticket = b.admit().expect("the wait is over again");
                assert_eq!(ticket.kind, TicketKind::Probe);
                b.record(ticket, Record::Success { slow: false });
            })
        };
        stale.join().expect("stale");
        fresh.join().expect("fresh");
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "the new phase's probe decides, not the old phase's late failure"
        );
        assert_eq!(state_by_counts(&b), CircuitState::Closed);
        assert_eq!(probes_in_flight(&b), 0);
    });
}

/// One permit: the phase's one probe ends with `outcome` on one thread while another
/// caller arrives on a second (and gives back a probe permit it gets). Returns the
/// breaker, the probe and what the caller was admitted with.
fn race_a_deciding_probe(outcome: Record) -> (Arc<BreakerState>, Ticket, Option<Ticket>) {
    let b = tripped(1, 1);
    let probe = b.admit().expect("the wait is over");
    assert_eq!(probe.kind, TicketKind::Probe);
    let deciding = {
        let b = Arc::clone(&b);
        thread::spawn(move || b.record(probe, outcome))
    };
    let caller = {
        let b = Arc::clone(&b);
        thread::spawn(move || {
            let ticket = b.admit().ok();
            if let Some(ticket) = ticket {
                if ticket.kind == TicketKind::Probe {
                    b.release_permit(ticket.epoch);
                }
            }
            ticket
        })
    };
    deciding.join().expect("deciding probe");
    let admitted = caller.join().expect("caller");
    (b, probe, admitted)
}

#[test]
fn loom_no_probe_is_admitted_in_a_phase_whose_probe_already_failed() {
    loom::model(|| {
        // The caller may probe a later phase (the wait is zero), never the failed one.
        let (b, probe, admitted) = race_a_deciding_probe(Record::Failure { slow: false });
        if let Some(ticket) = admitted {
            assert_ne!(
                ticket.epoch, probe.epoch,
                "a second probe in a phase with one permit, after its probe failed"
            );
        }
        assert_eq!(probes_in_flight(&b), 0);
        assert_eq!(state_by_counts(&b), b.state());
    });
}

#[test]
fn loom_no_probe_is_admitted_in_a_phase_whose_probe_already_succeeded() {
    loom::model(|| {
        let (b, _, admitted) = race_a_deciding_probe(Record::Success { slow: false });
        if let Some(ticket) = admitted {
            assert_ne!(
                ticket.kind,
                TicketKind::Probe,
                "a second probe in a phase with one permit, after its probe succeeded"
            );
        }
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(probes_in_flight(&b), 0);
        assert_eq!(state_by_counts(&b), CircuitState::Closed);
    });
}
