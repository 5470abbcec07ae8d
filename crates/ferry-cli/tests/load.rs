//! Load: several initiator processes against this process as the target,
//! thousands of operations in flight at once, mixed sizes and kinds, every
//! byte checked; afterwards nothing is left in the target's tables and its
//! memory is back near where it started.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use ferry::OperationStatus;
use ferry_cli::peer::{self, Cmd, PeerProcess};
use tokio::task::JoinSet;

/// Counts the bytes this process has allocated and not yet freed, so that a
/// leak shows exactly, whatever the allocator keeps cached.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to the system allocator with the same
// arguments and only adds bookkeeping on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            LIVE.fetch_add(new, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn size_of(i: usize) -> u64 {
    // 1 byte to 512 KiB, mixed.
    [1u64, 3000, 4096, 65_536, 200_000, 524_288][i % 6] + (i as u64 % 13)
}

async fn load(initiators: usize, ops: usize) {
    let local = connector().await;
    let mut peers = Vec::new();
    for _ in 0..initiators {
        peers.push(peer().await);
    }
    // Resident memory also counts what the allocator keeps cached for reuse
    // (glibc raises its mmap threshold as large blocks are freed), so the
    // leak check uses the live heap bytes; both are reported.
    let start = rss_bytes();
    run_round(&local, &peers, ops).await;
    let baseline = rss_bytes();
    let live_baseline = LIVE.load(Ordering::Relaxed);
    let mut peak = 0;
    for _ in 0..3 {
        peak = peak.max(run_round(&local, &peers, ops).await);
    }
    let live_after = LIVE.load(Ordering::Relaxed);
    assert_eq!(local.exposed_count(), 0, "exposed memory left behind");
    assert_eq!(local.pending_count(), 0, "requests left behind");
    for p in &peers {
        let st = p
            .request(peer::Request::new(0, Cmd::Stats))
            .await
            .unwrap()
            .expect("stats")
            .await
            .unwrap();
        assert_eq!(st.pending, Some(0), "{st:?}");
    }
    let after = rss_bytes();
    eprintln!(
        "{ops} operations from {initiators} processes a round: resident {} MiB at the start, {} MiB after a round, {} MiB at the peak of 3 more, {} MiB after them; live heap {} KiB after the first round, {} KiB after 3 more",
        start >> 20,
        baseline >> 20,
        peak >> 20,
        after >> 20,
        live_baseline >> 10,
        live_after >> 10
    );
    assert!(
        live_after <= live_baseline + (1 << 20),
        "the live heap grew over 3 rounds: from {} KiB to {} KiB",
        live_baseline >> 10,
        live_after >> 10
    );
}

/// All `ops` operations exposed at once, spread over the peers, half
/// readable and half writable; returns the resident size at the peak.
async fn run_round(local: &ferry::Connector, peers: &[PeerProcess], ops: usize) -> u64 {
    let mut readables = Vec::new();
    let mut writables = Vec::new();
    let mut answers = Vec::new();
    for i in 0..ops {
        let size = size_of(i);
        let p = &peers[i % peers.len()];
        if i % 2 == 0 {
            let r = local
                .create_readable(filled(&[size], i as u64))
                .await
                .unwrap();
            answers.push((
                i,
                p.request(with_meta(req(Cmd::Read, &[size], i as u64), r.metadata()))
                    .await
                    .unwrap(),
            ));
            readables.push(r);
        } else {
            let w = local.create_writable(zeroed(&[size])).await.unwrap();
            answers.push((
                i,
                p.request(with_meta(req(Cmd::Write, &[size], i as u64), w.metadata()))
                    .await
                    .unwrap(),
            ));
            writables.push((i, w));
        }
    }
    let peak = rss_bytes();
    let mut set = JoinSet::new();
    for r in readables {
        set.spawn(async move {
            r.wait_for_completion_timeout(Duration::from_secs(300))
                .await
                .unwrap();
        });
    }
    for (i, w) in writables {
        set.spawn(async move {
            w.wait_for_completion_timeout(Duration::from_secs(300))
                .await
                .unwrap();
            assert_eq!(w.status(), OperationStatus::Complete);
            assert!(
                peer::verify(&w.into_descriptors(), i as u64),
                "op {i}: bytes written differ"
            );
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    for (i, a) in &mut answers {
        let ev = done(a).await;
        assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "op {i}: {ev:?}");
        if *i % 2 == 0 {
            assert_eq!(ev.verified, Some(true), "op {i}: bytes read differ");
        }
    }
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_initiators_thousand_operations() {
    load(8, 1000).await;
}

/// The full load of the hardening issue: `cargo test --release -p ferry-cli --test load -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: 10,000 operations in flight"]
async fn stress_eight_initiators_ten_thousand_operations() {
    load(8, 10_000).await;
}
