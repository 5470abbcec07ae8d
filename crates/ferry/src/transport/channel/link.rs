//! An in-process byte channel between two endpoints, with faults a test
//! injects: each direction's bytes are held for a delay, cut into pieces
//! of at most a few bytes (so that frames arrive split anywhere), stalled
//! (nothing more arrives until resumed, as from a stopped peer), stalled
//! at a chosen byte (deterministically mid-frame or mid-payload), or cut
//! (both ends see the channel closed, as after a lost connection).
//!
//! Each direction is a relay task between the sender's queue and the
//! receiver's: it applies the faults in force when a chunk passes. Bytes
//! keep their order in every case.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

/// The faults in force on both directions of one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Faults {
    /// Each chunk is held this long before it passes.
    pub(crate) delay: Duration,
    /// Chunks pass in pieces of at most this many bytes (`None`: whole).
    pub(crate) split: Option<usize>,
    /// Nothing passes until this is false again.
    pub(crate) stalled: bool,
    /// Each direction passes this many bytes in all, then stalls (until
    /// this changes): a stall that begins at a chosen byte.
    pub(crate) stall_after: Option<u64>,
    /// The channel is cut: nothing passes any more, and both ends see it
    /// closed. Never undone.
    pub(crate) cut: bool,
}

/// One direction of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    /// From the first end of [`pair`] to the second.
    AtoB = 0,
    /// From the second end to the first.
    BtoA = 1,
}

/// What a test holds of a channel: the faults of each direction, changed
/// at any time.
#[derive(Clone)]
pub(crate) struct FaultHandle([Arc<watch::Sender<Faults>>; 2]);

impl FaultHandle {
    /// Changes the faults in force on both directions from now on.
    pub(crate) fn set(&self, f: impl Fn(&mut Faults)) {
        for w in &self.0 {
            w.send_modify(&f);
        }
    }

    /// Changes the faults in force on direction `way` from now on.
    pub(crate) fn set_way(&self, way: Way, f: impl FnOnce(&mut Faults)) {
        self.0[way as usize].send_modify(f);
    }

    /// Nothing passes any more, either way, until [`resume`](Self::resume).
    pub(crate) fn stall(&self) {
        self.set(|f| f.stalled = true);
    }

    /// Bytes held by a stall pass again.
    pub(crate) fn resume(&self) {
        self.set(|f| f.stalled = false);
    }

    /// Cuts the channel: both ends see it closed.
    pub(crate) fn cut(&self) {
        self.set(|f| f.cut = true);
    }
}

/// One end of a channel: it sends to the other end and receives from it.
pub(crate) struct End {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
}

/// The channel is closed (cut, or the other end went away).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed;

impl End {
    /// Queues `bytes` for the other end.
    pub(crate) fn send(&self, bytes: Vec<u8>) -> Result<(), Closed> {
        self.tx.send(bytes).map_err(|_| Closed)
    }

    /// The next bytes from the other end, in order; `None` once the
    /// channel is closed.
    pub(crate) async fn recv(&mut self) -> Option<Vec<u8>> {
        self.rx.recv().await
    }
}

/// A channel with `faults` in force from the start, both ways: its two
/// ends, and the handle that changes the faults. Its relays run on the
/// current tokio runtime.
pub(crate) fn pair(faults: Faults) -> (End, End, FaultHandle) {
    let ways = [0, 1].map(|_| Arc::new(watch::channel(faults).0));
    let (a_tx, a_out) = mpsc::unbounded_channel();
    let (b_tx, b_out) = mpsc::unbounded_channel();
    let (a_in, a_rx) = mpsc::unbounded_channel();
    let (b_in, b_rx) = mpsc::unbounded_channel();
    tokio::spawn(relay(a_out, b_in, ways[Way::AtoB as usize].clone()));
    tokio::spawn(relay(b_out, a_in, ways[Way::BtoA as usize].clone()));
    let a = End { tx: a_tx, rx: a_rx };
    let b = End { tx: b_tx, rx: b_rx };
    (a, b, FaultHandle(ways))
}

/// Carries one direction's chunks from `from` to `to` under the faults in
/// `faults`, until either end goes away or the channel is cut (dropping
/// `to` closes the receiver; the sender then finds its end closed too,
/// since this relay stops reading). It holds the faults' sender itself,
/// so that they stay as they are once the test lets its handle go.
async fn relay(
    mut from: mpsc::UnboundedReceiver<Vec<u8>>,
    to: mpsc::UnboundedSender<Vec<u8>>,
    faults: Arc<watch::Sender<Faults>>,
) {
    let mut state = faults.subscribe();
    let mut passed = 0u64;
    loop {
        let chunk = tokio::select! {
            c = from.recv() => match c {
                Some(c) => c,
                None => return,
            },
            _ = state.wait_for(|f| f.cut) => return,
        };
        let delay = state.borrow().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            // A stall holds these bytes, and every later one, until it
            // ends or the channel is cut.
            let free = |f: &Faults| !f.stalled && f.stall_after.map_or(true, |n| passed < n);
            let Ok(f) = state.wait_for(|f| f.cut || free(f)).await.map(|f| *f) else {
                return;
            };
            if f.cut {
                return;
            }
            let mut take = f.split.unwrap_or(usize::MAX).max(1).min(rest.len());
            if let Some(n) = f.stall_after {
                take = take.min(usize::try_from(n - passed).unwrap_or(usize::MAX));
            }
            if to.send(rest[..take].to_vec()).is_err() {
                return;
            }
            passed += take as u64;
            rest = &rest[take..];
        }
    }
}
