//! The peer's side of the raw UCX baseline (`ucx_lend`, `ucx_pull`): a
//! registered buffer for the other process to get from, or gets from the
//! other process's buffer, with `ferry::ucx::baseline` and no Ferry
//! protocol.

use std::sync::Mutex;
use std::time::Duration;

use ferry::ucx::baseline::{Getter, Lent, Node};

use super::{Event, Request};

/// The most registrations one `ucx_lend` times.
const MAX_SAMPLES: usize = 100;

/// This process's UCX workers for the baseline (made at their first use;
/// one lends, the other gets: see `Node`) and the buffer it lends.
#[derive(Default)]
pub(super) struct Raw {
    lender: Mutex<Option<Node>>,
    getter: Mutex<Option<Node>>,
    lent: Mutex<Option<Lent>>,
}

fn ns(d: &Duration) -> u64 {
    d.as_nanos() as u64
}

/// `f` on the worker in `node`, started first if needed.
fn with_node<T>(
    node: &Mutex<Option<Node>>,
    f: impl FnOnce(&Node) -> Result<T, String>,
) -> Result<T, String> {
    let mut node = node.lock().unwrap_or_else(|e| e.into_inner());
    match &mut *node {
        Some(n) => f(n),
        empty => f(empty.insert(Node::start()?)),
    }
}

impl Raw {
    /// `ucx_lend`: answers `lent` with the offer and registration times.
    pub(super) fn lend(&self, r: &Request) -> Event {
        let mut ev = Event::new(r.id, "lent");
        let size = r.sizes.first().copied().unwrap_or(0) as usize;
        let mut kept = self.lent.lock().unwrap_or_else(|e| e.into_inner());
        // The last buffer goes first (unregistered, freed).
        *kept = None;
        let samples = r.count.unwrap_or(1).clamp(1, MAX_SAMPLES);
        let made = Lent::new(size, samples).and_then(|l| {
            let offer = with_node(&self.lender, |n| Ok(l.offer(n)))?;
            Ok((l, offer))
        });
        match made {
            Ok((l, offer)) => {
                ev.ucx = Some(offer);
                ev.lat_ns = Some(l.registrations().iter().map(ns).collect());
                *kept = Some(l);
            }
            Err(e) => ev.error = Some(e),
        }
        ev
    }

    /// `ucx_pull`: answers `done` with the time of each get.
    pub(super) async fn pull(&self, r: &Request) -> Event {
        let mut ev = Event::new(r.id, "done");
        let offer = r.ucx.as_deref().unwrap_or_default();
        let count = r.count.unwrap_or(1);
        let got = match with_node(&self.getter, |n| n.connect(offer)) {
            Ok(g) => timed(g, count).await,
            Err(e) => Err(e),
        };
        match got {
            Ok(lat) => ev.lat_ns = Some(lat.iter().map(ns).collect()),
            Err(e) => ev.error = Some(e),
        }
        ev
    }
}

/// `count` gets by `g`, on a blocking thread (the getter polls its worker).
pub(crate) async fn timed(mut g: Getter, count: usize) -> Result<Vec<Duration>, String> {
    tokio::task::spawn_blocking(move || g.run(count))
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}
