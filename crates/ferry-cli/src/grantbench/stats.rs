//! Operations in flight and what they measured: `k` workers post one
//! operation after the other (a closed loop: each posts its next as soon as
//! its last completed), each operation's latency recorded, and the wall
//! time from the first post to the last completion.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How much one slice of a row measures: `n` operations, or fewer once
/// `time` has passed (at least `min`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) n: u64,
    pub(super) min: u64,
    pub(super) time: Duration,
}

impl Budget {
    /// Whether operation number `seq` (counted from 0) is posted.
    fn posts(&self, seq: u64, start: Instant) -> bool {
        seq < self.n && (seq < self.min || start.elapsed() < self.time)
    }
}

/// Latencies and the wall time they took, summed over slices.
#[derive(Debug, Default, Clone)]
pub(super) struct Samples {
    /// Post → completion on the side that posted.
    pub(super) lat: Vec<Duration>,
    /// Post → the owner's notification (writes).
    pub(super) notes: Vec<Duration>,
    /// From the first post to the last completion, summed over slices.
    pub(super) wall: Duration,
}

impl Samples {
    pub(super) fn add(&mut self, other: Samples) {
        self.lat.extend(other.lat);
        self.notes.extend(other.notes);
        self.wall += other.wall;
    }

    /// Operations measured.
    pub(super) fn ops(&self) -> usize {
        self.lat.len()
    }
}

/// The `p`th percentile of `v` in microseconds (`None` if empty).
pub(super) fn pct_us(v: &[Duration], p: usize) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let at = (s.len() * p / 100).min(s.len() - 1);
    Some(s[at].as_secs_f64() * 1e6)
}

/// What one operation measured: post → completion, and post → the
/// owner's notification if there is one.
pub(super) type Timed = (Duration, Option<Duration>);

/// Runs `k` workers at once, each awaiting `f(worker, seq)` (one
/// operation, what it measured) one after the other, until `budget` is
/// spent. Worker `w`'s first operation is number `w` and always posted,
/// however late a busy machine starts it: every worker moves its blocks
/// at least once (the check after a slice reads them all).
pub(super) async fn inflight<F, Fut>(k: usize, budget: Budget, f: F) -> anyhow::Result<Samples>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<Timed>> + Send + 'static,
{
    let f = Arc::new(f);
    let k = k.max(1);
    let next = Arc::new(AtomicU64::new(k as u64));
    let start = Instant::now();
    let workers: Vec<_> = (0..k)
        .map(|w| {
            let (f, next) = (f.clone(), next.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut seq = w as u64;
                while got.is_empty() || budget.posts(seq, start) {
                    got.push(f(w, seq).await?);
                    seq = next.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(got)
            })
        })
        .collect();
    let mut out = Samples::default();
    for w in workers {
        for (lat, note) in w.await?? {
            out.lat.push(lat);
            out.notes.extend(note);
        }
    }
    out.wall = start.elapsed();
    Ok(out)
}

/// The same with one thread per worker, for blocking operations: worker
/// `w` runs `f(&mut states[w], seq)`.
pub(super) fn inflight_blocking<S: Send>(
    mut states: Vec<S>,
    budget: Budget,
    f: impl Fn(&mut S, u64) -> anyhow::Result<Duration> + Sync,
) -> anyhow::Result<Samples> {
    let next = AtomicU64::new(states.len() as u64);
    let start = Instant::now();
    let lats = std::thread::scope(|scope| {
        let workers: Vec<_> = states
            .iter_mut()
            .enumerate()
            .map(|(w, s)| {
                let (f, next) = (&f, &next);
                scope.spawn(move || {
                    let mut lat = Vec::new();
                    let mut seq = w as u64;
                    while lat.is_empty() || budget.posts(seq, start) {
                        lat.push(f(s, seq)?);
                        seq = next.fetch_add(1, Ordering::Relaxed);
                    }
                    anyhow::Ok(lat)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .map_err(|_| anyhow::anyhow!("a raw worker panicked"))?
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    Ok(Samples {
        lat: lats.into_iter().flatten().collect(),
        notes: Vec::new(),
        wall: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_from_the_sorted_samples() {
        let us = Duration::from_micros;
        let v: Vec<Duration> = (1..=100).rev().map(us).collect();
        assert_eq!(pct_us(&v, 50), Some(51.0));
        assert_eq!(pct_us(&v, 99), Some(100.0));
        assert_eq!(pct_us(&[us(7)], 99), Some(7.0));
        assert_eq!(pct_us(&[], 50), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_run_at_once_and_stop_at_the_budget() {
        let budget = Budget {
            n: 64,
            min: 1,
            time: Duration::from_secs(10),
        };
        let s = inflight(8, budget, |_, _| async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok((Duration::from_millis(5), None))
        })
        .await
        .unwrap();
        assert_eq!(s.ops(), 64);
        // Eight at once: about 8 rounds of 5 ms, far from 64 of them.
        assert!(s.wall < Duration::from_millis(200), "{:?}", s.wall);
        let b = inflight_blocking(vec![0u32; 4], budget, |n, _| {
            *n += 1;
            Ok(Duration::from_micros(1))
        })
        .unwrap();
        assert_eq!(b.ops(), 64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_worker_posts_once_even_past_the_budget() {
        // A budget already spent when the workers start: each still moves
        // its blocks once, and only once.
        let spent = Budget {
            n: 8,
            min: 0,
            time: Duration::ZERO,
        };
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let s = inflight(8, spent, move |w, seq| {
            s2.lock().unwrap().push((w, seq));
            async { Ok((Duration::from_micros(1), None)) }
        })
        .await
        .unwrap();
        assert_eq!(s.ops(), 8);
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..8).map(|w| (w, w as u64)).collect::<Vec<_>>());
        let b = inflight_blocking(vec![0u32; 4], spent, |n, _| {
            *n += 1;
            Ok(Duration::from_micros(1))
        })
        .unwrap();
        assert_eq!(b.ops(), 4);
    }
}
