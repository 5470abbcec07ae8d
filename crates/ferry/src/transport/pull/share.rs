//! One pull's copies shared among threads.
//!
//! A single thread's `process_vm_readv` does not reach the memory's
//! bandwidth: on this project's 2-core test machine one thread copies
//! 64 MiB of huge pages at about 21 GB/s and two at about 24 GB/s, and
//! machines with more memory channels gain more. A large pull therefore
//! splits into *units* (a chunk of a large segment, or a run of small ones,
//! each one `Region::copy_into` call) that the pull's own thread and a few
//! helper threads take in turn from a shared counter.
//!
//! Nothing of the fence changes: each unit is still one bounded copy
//! counted by the region, every thread stops at the region's first
//! refusal, and the caller seals only after every thread has returned. The
//! helpers are scoped threads: the pull does not return while one of them
//! still copies, so no pointer outlives the call.
//!
//! Helpers are bounded process-wide: a pull gets one only while the threads
//! copying pulls (their own and helpers) stay within [`max_threads`] (the
//! host's cores up to 4, or `FERRY_CMA_THREADS`). Several pulls in flight
//! already keep the cores busy, and then copy alone: more threads than
//! cores only contend. A peer that stalls a helper's copy (its pages never
//! arrive) keeps that helper, and the pull waiting for it, as it would have
//! kept the pull's own thread; until it returns it counts as copying.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use ferry_proto::lane::FailureScope;

use super::{LaneError, PullEnd};

/// Threads copying a pull now, in the whole process: pulls' own threads
/// and their helpers.
static COPYING: AtomicUsize = AtomicUsize::new(0);

/// How many threads of the process may copy pulls at once before no pull
/// gets a helper (`FERRY_CMA_THREADS`, else the host's cores up to
/// 4, read once: [`ProcessConfig`](crate::config::ProcessConfig)). Pulls themselves are never refused: their
/// number is bounded by the copy slots (`stall.rs`).
pub(crate) fn max_threads() -> usize {
    crate::config::process().cma_threads.value
}

/// A pull's place among the threads that copy (`COPYING` outside tests):
/// its own thread, and the helpers it got. Given back when dropped.
struct Taken<'a> {
    copying: &'a AtomicUsize,
    helpers: usize,
}

impl<'a> Taken<'a> {
    /// Counts the caller's thread, and up to `want` helpers as long as the
    /// threads copying stay within `max`.
    fn take(copying: &'a AtomicUsize, want: usize, max: usize) -> Taken<'a> {
        let mut helpers = 0;
        let _ = copying.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            helpers = want.min(max.saturating_sub(now + 1));
            Some(now + 1 + helpers)
        });
        Taken { copying, helpers }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.copying.fetch_sub(1 + self.helpers, Ordering::AcqRel);
    }
}

/// Runs `copy` on every unit, in order of their index but on up to
/// `1 + helpers` threads (the caller's and `helpers` scoped ones, as many
/// as the budget gives), and returns once every thread has stopped: `None`
/// when every unit was copied, else the first reason a copy gave to stop
/// (after which no thread starts another unit).
pub(crate) fn run<U: Sync>(
    units: &[U],
    helpers: usize,
    copy: impl Fn(&U) -> Result<(), PullEnd> + Sync,
) -> Option<PullEnd> {
    run_within(&COPYING, max_threads(), units, helpers, copy)
}

/// [`run`] with the threads copying counted in `copying`, helpers only while
/// they stay within `max`.
fn run_within<U: Sync>(
    copying: &AtomicUsize,
    max: usize,
    units: &[U],
    helpers: usize,
    copy: impl Fn(&U) -> Result<(), PullEnd> + Sync,
) -> Option<PullEnd> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first: Mutex<Option<PullEnd>> = Mutex::new(None);
    // Stops every thread at its next unit, keeping the first reason.
    let halt = |end: PullEnd| {
        stop.store(true, Ordering::Release);
        first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(end);
    };
    let work = || {
        while !stop.load(Ordering::Acquire) {
            let Some(u) = units.get(next.fetch_add(1, Ordering::AcqRel)) else {
                return;
            };
            if let Err(end) = copy(u) {
                return halt(end);
            }
        }
    };
    let taken = Taken::take(copying, helpers.min(units.len().saturating_sub(1)), max);
    if taken.helpers == 0 {
        work();
    } else {
        std::thread::scope(|s| {
            let mut started = Vec::with_capacity(taken.helpers);
            for _ in 0..taken.helpers {
                let spawned = std::thread::Builder::new()
                    .name("ferry-copy-helper".into())
                    .stack_size(128 * 1024)
                    .spawn_scoped(s, work);
                match spawned {
                    Ok(h) => started.push(h),
                    // Fewer helpers: the units are shared by those there are.
                    Err(e) => tracing::debug!("no copy helper thread: {e}"),
                }
            }
            work();
            for h in started {
                if h.join().is_err() {
                    halt(PullEnd::failed(
                        FailureScope::Connection,
                        LaneError::Copy {
                            detail: "a copy helper thread panicked".into(),
                        },
                    ));
                }
            }
        });
    }
    drop(taken);
    first.into_inner().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;

    fn gone() -> PullEnd {
        PullEnd::failed(
            FailureScope::Connection,
            LaneError::SourceGone {
                detail: "gone".into(),
            },
        )
    }

    #[test]
    fn every_unit_is_copied_once_whatever_the_threads() {
        let running = AtomicUsize::new(0);
        for helpers in [0, 1, 3, 16] {
            let units: Vec<usize> = (0..1000).collect();
            let seen = Mutex::new(HashSet::new());
            let threads = Mutex::new(HashSet::new());
            let end = run_within(&running, 3, &units, helpers, |u| {
                threads.lock().unwrap().insert(std::thread::current().id());
                assert!(seen.lock().unwrap().insert(*u), "unit {u} copied twice");
                Ok(())
            });
            assert_eq!(end, None);
            assert_eq!(seen.lock().unwrap().len(), 1000, "helpers {helpers}");
            assert!(threads.lock().unwrap().len() <= 1 + helpers.min(2));
            assert_eq!(running.load(Ordering::Acquire), 0, "helpers given back");
        }
    }

    #[test]
    fn the_first_stop_ends_every_thread() {
        let running = AtomicUsize::new(0);
        let units: Vec<usize> = (0..10_000).collect();
        let copied = AtomicUsize::new(0);
        let end = run_within(&running, 3, &units, 3, |u| {
            if *u == 10 {
                return Err(PullEnd::Closed);
            }
            std::thread::sleep(Duration::from_millis(1));
            copied.fetch_add(1, Ordering::AcqRel);
            Ok(())
        });
        assert_eq!(end, Some(PullEnd::Closed));
        // Each thread ends with the unit it holds when the stop comes.
        let n = copied.load(Ordering::Acquire);
        assert!(n < 1000, "{n} units copied after a stop at the 11th");
        let end = run_within(&running, 3, &units, 3, |u| {
            if *u == 50 {
                return Err(gone());
            }
            Ok(())
        });
        assert_eq!(end, Some(gone()));
        assert_eq!(running.load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_budget_is_never_exceeded() {
        let running = AtomicUsize::new(0);
        // At most 4 threads copying: a pull of its own takes 2 helpers, the
        // next pulls none (they still copy, alone).
        let a = Taken::take(&running, 2, 4);
        let c = Taken::take(&running, 5, 4);
        assert_eq!((a.helpers, c.helpers), (2, 0));
        assert_eq!(running.load(Ordering::Acquire), 4);
        let d = Taken::take(&running, 1, 4);
        assert_eq!(d.helpers, 0);
        drop((a, d));
        let e = Taken::take(&running, 5, 4);
        assert_eq!(e.helpers, 2, "the threads given back are taken again");
        drop((c, e));
        assert_eq!(running.load(Ordering::Acquire), 0);
    }
}
