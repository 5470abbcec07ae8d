//! Raw UCX for `ferry bench`'s baseline (`ferry::ucx::baseline`): one
//! process lends a registered buffer, the other times `ucp_get_nbx` of it,
//! with no Ferry protocol around them. The same context (one `libucp`
//! loaded per process), the same worker set-up, endpoints, keys and get
//! completion as the UCX backend's, and the same wait (`Batch::wait_until`: the
//! waiting thread polls the worker for a while, then sleeps until the
//! worker's progress task sees the end).
//!
//! The offer a lender sends is, little endian:
//!
//! ```text
//! u32 n, n bytes of worker address, then the key list of `mem::encode_keys`
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::watch;

use super::{decode_keys, encode_keys, post_get, ucx, Batch, Endpoint, MemReg, RemoteKeys};
use crate::hugemem::Mapping;

/// The longest one get may take before the getter gives up on it.
const GET_TIMEOUT: Duration = Duration::from_secs(20);

/// A UCP worker of this process's UCX context, progressed (on its event
/// descriptor) by a task of the Tokio runtime it was started on, as a
/// connector's worker is; stopped when dropped.
///
/// Use one node to lend and another to get: a node that got from a peer's
/// node must not lend to it afterwards (with UCX 1.13, once the getter's
/// endpoint was closed, a get the other way between the same two workers
/// fails with "Connection reset by remote peer", after the 20 s keepalive).
pub struct Node {
    worker: Arc<super::Worker>,
    stop: watch::Sender<bool>,
}

impl Node {
    /// A worker on the current Tokio runtime, or why there is none (no
    /// runtime, no UCX).
    pub fn start() -> Result<Node, String> {
        let handle = Handle::try_current().map_err(|_| "a UCX node needs a Tokio runtime")?;
        let (stop, rx) = watch::channel(false);
        let worker = super::Worker::start(&handle, rx, true)?;
        Ok(Node { worker, stop })
    }

    /// A getter of what a peer's [`Lent::offer`] describes: an endpoint to
    /// its worker and a buffer of the lent length (written, so that its
    /// pages are real), or why the offer cannot be used.
    pub fn connect(&self, offer: &[u8]) -> Result<Getter, String> {
        let (address, keys) = split_offer(offer)?;
        let (base, len) = match decode_keys(keys)?.as_slice() {
            [(base, len, _)] if *len > 0 && *len <= isize::MAX as u64 => (*base, *len),
            k => return Err(format!("an offer of {} keys (one, not empty)", k.len())),
        };
        let mut dst =
            Mapping::new(len as usize).map_err(|e| format!("an offer of {len} bytes: {e}"))?;
        dst.as_mut_slice().fill(1);
        let ep = self.worker.connect(address)?;
        Ok(Getter {
            ep,
            keys: keys.to_vec(),
            base,
            dst: Some(dst),
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Ends the progress task (a dropped sender alone would not).
        let _ = self.stop.send(true);
    }
}

/// The address and the key bytes of an offer.
fn split_offer(b: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let n = b
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or("an offer without its address length")? as usize;
    let rest = &b[4..];
    if n == 0 || n > rest.len() {
        return Err(format!("an offer with a worker address of {n} bytes"));
    }
    Ok(rest.split_at(n))
}

/// A buffer registered with UCX (`ucp_mem_map`, its key packed), for a peer
/// to get from; unregistered, then freed, when dropped.
pub struct Lent {
    /// Declared first: dropped (unregistered) before the buffer is freed.
    reg: Option<Arc<MemReg>>,
    /// The packed key list of the registration.
    keys: Vec<u8>,
    /// The lent memory (only the tests read it; kept until the end),
    /// allocated as the bench's other buffers are.
    #[cfg_attr(not(test), allow(dead_code))]
    buf: Mapping,
    took: Vec<Duration>,
}

impl Lent {
    /// `len` bytes (at least one) written with ones, as the bench's other
    /// buffers are, registered `samples` times (at least once; each
    /// registration but the last is undone at once) to time it.
    pub fn new(len: usize, samples: usize) -> Result<Lent, String> {
        if len == 0 {
            return Err("nothing to lend".into());
        }
        let ucx = ucx().map_err(str::to_string)?;
        let mut buf = Mapping::new(len).map_err(|e| format!("{len} bytes: {e}"))?;
        buf.as_mut_slice().fill(1);
        let base = buf.ptr() as u64;
        let mut took = Vec::new();
        loop {
            let t = Instant::now();
            let reg = MemReg::register(ucx, base, len as u64)?;
            took.push(t.elapsed());
            if took.len() >= samples.max(1) {
                let keys = encode_keys(std::slice::from_ref(&reg));
                return Ok(Lent {
                    reg: Some(reg),
                    keys,
                    buf,
                    took,
                });
            }
        }
    }

    /// How long each registration took: `ucp_mem_map` and `ucp_rkey_pack`
    /// of the whole buffer (with the copy of the packed key).
    pub fn registrations(&self) -> &[Duration] {
        &self.took
    }

    /// The bytes a peer's [`Node::connect`] needs: `node`'s worker address,
    /// the buffer's address and length, and its packed remote key.
    pub fn offer(&self, node: &Node) -> Vec<u8> {
        let address = node.worker.address();
        let mut out = (address.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(address);
        out.extend_from_slice(&self.keys);
        out
    }

    /// Unregisters the buffer (`ucp_mem_unmap`), as strict registration
    /// does when an operation ends, and keeps it: a getter's key of it
    /// should then fail where keys are checked (RDMA).
    pub fn unregister(&mut self) {
        self.reg = None;
    }
}

/// An endpoint to a lender's worker and a local buffer of the lent length:
/// [`Getter::run`] gets the whole lent buffer into it, again and again.
pub struct Getter {
    ep: Endpoint,
    keys: Vec<u8>,
    base: u64,
    /// Allocated as the bench's other buffers are; `None` once a get was
    /// given up on (its memory is then leaked).
    dst: Option<Mapping>,
}

impl Getter {
    /// The endpoint's lanes: transport/device and uses, e.g.
    /// `tcp/lo.0 (am am_bw#0 keepalive wireup)` (see `Endpoint::lanes`).
    pub fn lanes(&self) -> Vec<String> {
        self.ep.lanes()
    }

    /// Bytes one get moves.
    pub fn len(&self) -> usize {
        self.dst.as_ref().map_or(0, |d| d.as_slice().len())
    }

    /// Whether the lent buffer is empty (never: an offer lends at least a
    /// byte; kept for symmetry with [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` gets of the whole lent buffer, one at a time: each is posted
    /// (`ucp_get_nbx`), then waited for as the UCX backend waits for its
    /// gets. The time of each, from the post to its end.
    pub fn run(&mut self, n: usize) -> Result<Vec<Duration>, String> {
        let Some(dst) = self.dst.as_ref().map(|d| d.ptr()) else {
            return Err("an earlier get never ended".into());
        };
        let decoded = decode_keys(&self.keys)?;
        let keys = RemoteKeys::unpack(&self.ep, &decoded)?;
        let len = self.len();
        let rkey = keys
            .find(self.base, len as u64)
            .ok_or("the offer's key does not cover its buffer")?;
        let worker = &self.ep.worker;
        let api = &worker.ucx.api;
        let mut lat = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let batch = Batch::new();
            let t = Instant::now();
            // SAFETY: `dst` is `len` bytes of this getter's buffer, and the
            // key is unpacked in `keys`: both stay until the get ended
            // (polled below), or are leaked if it never does.
            let posted = unsafe { post_get(&self.ep, &batch, dst, len, self.base, rkey) };
            if let Err(s) = posted {
                return Err(format!("ucp_get_nbx: {}", api.describe(s)));
            }
            let Some(status) = batch.wait_until(worker, Some(t + GET_TIMEOUT)) else {
                // UCX may still write into the buffer and read the key: both
                // are leaked, never freed.
                std::mem::forget(keys);
                std::mem::forget(self.dst.take());
                return Err(format!("a UCX get did not end within {GET_TIMEOUT:?}"));
            };
            lat.push(t.elapsed());
            if let Some(s) = status {
                return Err(format!("a UCX get failed: {}", api.describe(s)));
            }
        }
        Ok(lat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_are_checked_before_use() {
        assert!(split_offer(&[]).is_err());
        assert!(split_offer(&[0, 0, 0, 0, 1]).is_err());
        assert!(split_offer(&[2, 0, 0, 0, 1]).is_err());
        let (a, k) = split_offer(&[1, 0, 0, 0, 7, 8, 9]).unwrap();
        assert_eq!((a, k), (&[7u8][..], &[8u8, 9][..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_gets_what_another_lends() {
        if let Err(why) = ucx() {
            eprintln!("skipped: no UCX ({why})");
            return;
        }
        let (a, b) = (Node::start().unwrap(), Node::start().unwrap());
        let mut lent = Lent::new(3 << 20, 3).unwrap();
        assert_eq!(lent.registrations().len(), 3);
        lent.buf
            .as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as u8);
        let mut g = b.connect(&lent.offer(&a)).unwrap();
        assert_eq!(g.len(), 3 << 20);
        let (g, lat) = tokio::task::spawn_blocking(move || {
            let lat = g.run(3);
            (g, lat)
        })
        .await
        .unwrap();
        assert_eq!(lat.unwrap().len(), 3);
        assert!(g.dst.as_ref().unwrap().as_slice() == lent.buf.as_slice());
        let lanes = g.lanes();
        assert!(
            !lanes.is_empty() && lanes.iter().all(|l| l.contains('/')),
            "{lanes:?}"
        );
        assert!(b.connect(&lent.offer(&a)[..10]).is_err());
        // Again, the same way (a new endpoint between the same workers).
        drop(g);
        let mut g = b.connect(&lent.offer(&a)).unwrap();
        let lat = tokio::task::spawn_blocking(move || g.run(2)).await.unwrap();
        assert_eq!(lat.unwrap().len(), 2);
    }
}
