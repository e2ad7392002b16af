//! Counting heap allocations, with [`stats_alloc`].
//!
//! The counting allocator must be the global allocator of the test binary, and only a
//! binary can declare it: each test file that measures declares it as below, then
//! measures with [`measure`]. The counter is process-wide: it sees every thread, so tests
//! of one binary that measure take [`one_at_a_time`], and a test that must not count the
//! harness's own allocations takes the least of a few runs ([`least_of`]). [`measure`]
//! panics if the global allocator was not declared, rather than reporting zero
//! allocations.
//!
//! ```
//! use std::alloc::System;
//! use toolshield_test::alloc::{least_of, measure, one_at_a_time, StatsAlloc, INSTRUMENTED_SYSTEM};
//!
//! #[global_allocator]
//! static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;
//!
//! fn main() {
//!     let _one_at_a_time = one_at_a_time();
//!     let (len, stats) = measure(|| std::hint::black_box(vec![1_u8, 2, 3]).len());
//!     assert_eq!(len, 3);
//!     assert!(stats.allocations >= 1);
//!     let none = least_of(3, || measure(|| 2 + 2).1.allocations);
//!     assert_eq!(none, 0);
//! }
//! ```

use std::sync::{Mutex, MutexGuard};

pub use stats_alloc::{Region, Stats, StatsAlloc, INSTRUMENTED_SYSTEM};

/// Runs `f` and returns its value with the allocations made meanwhile (by every thread).
///
/// # Panics
///
/// If the test binary's global allocator is not [`INSTRUMENTED_SYSTEM`] (see the module
/// docs): nothing would be counted.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Stats) {
    assert!(
        is_counting(),
        "declare `#[global_allocator] static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;` in this test binary"
    );
    let region = Region::new(&INSTRUMENTED_SYSTEM);
    let value = f();
    let stats = region.change();
    (value, stats)
}

/// Whether [`INSTRUMENTED_SYSTEM`] is the global allocator of this binary: an allocation
/// is seen by its counter.
pub fn is_counting() -> bool {
    let region = Region::new(&INSTRUMENTED_SYSTEM);
    drop(std::hint::black_box(Box::new(0_u64)));
    region.change().allocations > 0
}

/// The least of `runs` results of `f`: a layer that allocates per call adds to every run,
/// while another thread (the harness printing as a test starts) adds to one now and then.
///
/// # Panics
///
/// If `runs` is 0.
pub fn least_of<T: Ord>(runs: usize, mut f: impl FnMut() -> T) -> T {
    (0..runs)
        .map(|_| f())
        .min()
        .expect("least_of: at least one run")
}

/// Holds the measuring lock of this test binary: the tests that measure take it so that
/// one counts at a time (the counter sees every thread).
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static MEASURING: Mutex<()> = Mutex::new(());
    MEASURING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Heap allocations (and reallocations) made by `calls` successful calls through `svc`,
/// the least of three runs ([`least_of`]): the requests are made by `request` outside the
/// measured region, and each call is polled (with a no-op waker) until it is ready.
///
/// # Panics
///
/// If a call fails or `svc` is not ready, or (see [`measure`]) if the counting allocator
/// is not the binary's global allocator.
pub fn allocations_of_calls<S>(
    svc: &mut S,
    calls: usize,
    mut request: impl FnMut() -> toolshield_core::ToolRequest,
) -> usize
where
    S: tower::Service<toolshield_core::ToolRequest, Error = toolshield_core::ToolError>,
{
    use std::task::{Context, Waker};

    let mut cx = Context::from_waker(Waker::noop());
    least_of(3, || {
        let requests: Vec<_> = (0..calls).map(|_| request()).collect();
        let (ok, stats) = measure(|| {
            let mut ok = 0;
            for req in requests {
                assert!(svc.poll_ready(&mut cx).is_ready(), "the service is ready");
                match crate::block_on(svc.call(req)) {
                    Ok(_) => ok += 1,
                    Err(e) => panic!("expected a success, got {e:?}"),
                }
            }
            ok
        });
        assert_eq!(ok, calls, "every call succeeds");
        stats.allocations + stats.reallocations
    })
}
