//! The same-process transport: when the remote connector lives in this
//! process, the bytes move with a plain copy between the two regions.
//!
//! The capability checks are the same as over TCP (the exposure table's
//! `open`). Host memory on both sides moves by the same-process lane
//! (`pull::process`, which passes the lanes' conformance suite): chunk by
//! chunk through both regions' fences, so a cancel on either side is
//! fenced within one chunk, and sealed last under both locks, both
//! operations at once, so a cancel either stops the transfer or finds it
//! sealed and both sides agree on the outcome. Device (GPU) memory on
//! either side goes through a host buffer, each region's access under its
//! own lock (`through_host`): the same fence, with the device's copies
//! finished before each lock is let go, and the lane's seal
//! (`process::seal_both`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ferry_proto::wire::Open;
use ferry_proto::{OperationKind, OperationStatus, RdmaMetadata};

use super::api::{ActiveJob, ActiveLink, BoxFuture, Host, Transport};
use crate::auth::Secret;
use crate::cuda::CudaError;
use crate::exposure::{Exposure, PassiveLink, Refusal};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::{Denied, Region};
use crate::sync::lock;
use crate::transport::pull::process::{seal_both, ProcessPeer, ProcessPuller, CHUNK};
use crate::transport::pull::{Lane, PullEnd};
use crate::{host, Error, Result};

/// Copies larger than this run on a blocking thread, not on the runtime.
const INLINE: u64 = 1 << 20;

type Entry = (String, Vec<SocketAddr>, Weak<Host>);

fn registry() -> &'static Mutex<Vec<Entry>> {
    static R: OnceLock<Mutex<Vec<Entry>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

/// Makes a connector reachable by the others of this process.
pub(crate) fn register(worker_id: &str, addrs: &[SocketAddr], inner: &Arc<Host>) {
    let mut r = lock(registry());
    r.retain(|(_, _, w)| w.strong_count() > 0);
    r.push((worker_id.to_string(), addrs.to_vec(), Arc::downgrade(inner)));
}

fn find(remote: &RdmaMetadata) -> Option<Arc<Host>> {
    if remote.process_id() != Some(host::process_id()) {
        return None;
    }
    lock(registry())
        .iter()
        .find(|(id, addrs, _)| id == remote.worker_id() && addrs == remote.addresses())
        .and_then(|(_, _, w)| w.upgrade())
        .filter(|inner| !inner.is_shut_down())
}

/// Copies between connectors of this process that share this connector's
/// secret (or, like it, have none): the same rule as over the network.
pub(crate) struct LocalTransport {
    pub(crate) secret: Option<Secret>,
    /// This connector's end-to-end integrity check is on: the copy is
    /// digested on both sides (as is one to a connector whose check is).
    pub(crate) digest: bool,
}

impl LocalTransport {
    fn find(&self, remote: &RdmaMetadata) -> Option<Arc<Host>> {
        find(remote).filter(|inner| inner.secret == self.secret)
    }
}

struct LocalLink;

/// The passive side's binding: the copier notices a cancel through the
/// closed region, so there is nothing to tell.
struct LocalBinding;

impl PassiveLink for LocalBinding {
    fn leave(&self) {}
    fn ended(&self, _how: Option<&Refusal>) {}
    fn withdrawn(&self, _how: Option<Refusal>) {}
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl ActiveLink for LocalLink {
    fn cancel(&self, _changed: bool) {
        // The copier sees the closed region and tells the passive side.
    }
}

impl Transport for LocalTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Local
    }

    fn reaches(&self, remote: &RdmaMetadata) -> bool {
        self.find(remote).is_some()
    }

    fn start(&self, job: ActiveJob) -> BoxFuture<'_, Result<Arc<dyn ActiveLink>>> {
        Box::pin(async move {
            let inner = self.find(&job.remote).ok_or_else(|| Error::Unreachable {
                worker: job.remote.worker_id().to_string(),
                addresses: "this process".into(),
                cause: "the connector has shut down".into(),
            })?;
            job.shared.set_transport(TransportKind::Local);
            job.shared.start();
            job.shared.opened(None);
            let open = Open {
                req: 0,
                op_id: job.remote.operation_id(),
                token: *job.remote.token(),
                kind: job.kind,
                sizes: job.sizes.as_slice().into(),
                pull: false,
                part: 0,
                parts: 1,
            };
            let mut bind = |bound: Option<&Arc<dyn PassiveLink>>| match bound {
                None => Ok(Arc::new(LocalBinding) as Arc<dyn PassiveLink>),
                Some(_) => Err((ferry_proto::wire::AbortReason::Busy, String::new())),
            };
            // No lending between connectors of one process: every copy
            // goes through `copy` (device memory through a host buffer).
            let caps = ferry_proto::session::Caps::default();
            let exposure = match inner.exposures.open(&open, None, caps, &mut bind) {
                Ok((e, _)) => e,
                Err((reason, detail)) => {
                    job.region.close();
                    job.shared.fail(Error::Rejected { reason, detail });
                    return Ok(Arc::new(LocalLink) as Arc<dyn ActiveLink>);
                }
            };
            exposure.shared.set_transport(TransportKind::Local);
            let total: u64 = job.sizes.iter().sum();
            let digest = self.digest || inner.digest;
            let run = move || {
                copy(
                    &inner,
                    &exposure,
                    job.kind,
                    &job.region,
                    &job.shared,
                    &job.sizes,
                    digest,
                )
            };
            if total <= INLINE {
                run();
            } else {
                tokio::task::spawn_blocking(run);
            }
            Ok(Arc::new(LocalLink) as Arc<dyn ActiveLink>)
        })
    }
}

/// Copies `n` bytes of segment `i` from `off` between two regions of which
/// one or both are device memory, through `tmp`: each region's own access
/// (host memory under its lock, device memory staged under its lock, see
/// `Region::stage_in`), one after the other. The outer `Err` is a failed
/// device copy; the inner one the regions' answer, as for host memory.
fn through_host(
    src: &Region,
    dst: &Region,
    i: usize,
    off: u64,
    n: usize,
    tmp: &mut Vec<u8>,
) -> std::result::Result<std::result::Result<(), Denied>, CudaError> {
    tmp.resize(n, 0);
    let got = if src.is_host() {
        src.read_at(i, off, n, |s| tmp.copy_from_slice(s))
            .map(|()| Ok(n))
    } else {
        src.stage_out(i, off, tmp)
    };
    if let Err(d) = whole(got, n)? {
        return Ok(Err(d));
    }
    let put = if dst.is_host() {
        dst.write_at(i, off, n, |d| d.copy_from_slice(tmp))
            .map(|()| Ok(n))
    } else {
        dst.stage_in(i, off, tmp)
    };
    whole(put, n)
}

/// One access of `through_host`, which must move all `n` bytes (one chunk
/// lies within one segment): a failed device copy outside, the region's
/// answer inside.
fn whole(
    r: std::result::Result<std::result::Result<usize, CudaError>, Denied>,
    n: usize,
) -> std::result::Result<std::result::Result<(), Denied>, CudaError> {
    match r {
        Ok(Ok(k)) if k == n => Ok(Ok(())),
        Ok(Ok(_)) => Ok(Err(Denied::OutOfBounds)),
        Ok(Err(e)) => Err(e),
        Err(d) => Ok(Err(d)),
    }
}

/// Copies every byte between the two regions, then ends both operations.
fn copy(
    inner: &Host,
    exposure: &Exposure,
    kind: OperationKind,
    active: &Arc<Region>,
    shared: &Arc<OpShared>,
    sizes: &[u64],
    digest: bool,
) {
    let ((src, src_op), (dst, dst_op)) = match kind {
        OperationKind::Read => ((&exposure.region, &exposure.shared), (active, shared)),
        OperationKind::Write => ((active, shared), (&exposure.region, &exposure.shared)),
    };
    shared.first_byte();
    exposure.shared.first_byte();
    if src.is_host() && dst.is_host() {
        // The same-process lane, which seals both operations.
        let peer = ProcessPeer::new(src.clone(), Some(src_op.clone()));
        let lease = ProcessPuller.lend(src, None);
        let done = ProcessPuller.pull(&peer, &lease, dst, dst_op) == PullEnd::Done;
        let sealed = done && shared.is_sealed();
        #[cfg(test)]
        if sealed {
            crate::transport::digest::corrupt_for_tests(dst);
        }
        if sealed && digest {
            // Both sides sealed, neither reported: a pass over each region
            // (both of this process) decides before either completes.
            if let Some(detail) = crate::transport::digest::differ(src, dst) {
                let error = Error::DigestMismatch { detail };
                active.close();
                shared.fail(error.clone());
                inner
                    .exposures
                    .finish(exposure, OperationStatus::Errored, Some(error));
                return;
            }
        }
        return settle(inner, exposure, active, shared, sealed);
    }
    let mut stopped = false;
    // Device memory on either side goes through this host buffer.
    let mut tmp = Vec::new();
    'outer: for (i, &size) in sizes.iter().enumerate() {
        let mut off = 0usize;
        while (off as u64) < size {
            let n = CHUNK.min(size as usize - off);
            match through_host(src, dst, i, off as u64, n, &mut tmp) {
                Ok(Ok(())) => off += n,
                Ok(Err(Denied::Closed)) => {
                    stopped = true;
                    break 'outer;
                }
                Ok(Err(Denied::OutOfBounds | Denied::NotHostMemory)) => {
                    // Sizes were checked against the exposure, and
                    // `through_host` stages device memory, never the host
                    // accesses; cannot happen.
                    stopped = true;
                    break 'outer;
                }
                Err(e) => {
                    let error = Error::DeviceCopy {
                        reason: e.to_string(),
                    };
                    active.close();
                    shared.fail(error.clone());
                    inner
                        .exposures
                        .finish(exposure, OperationStatus::Errored, Some(error));
                    return;
                }
            }
        }
    }
    let sealed = !stopped && seal_both(src, dst, dst_op, Some(src_op)) && shared.is_sealed();
    settle(inner, exposure, active, shared, sealed);
}

/// Ends both operations once the copy stopped: complete where it `sealed`
/// them, else cancelled on the side that did not close its region.
fn settle(inner: &Host, exposure: &Exposure, active: &Region, shared: &OpShared, sealed: bool) {
    if sealed {
        inner
            .exposures
            .finish(exposure, OperationStatus::Complete, None);
        active.close();
        shared.end(OperationStatus::Complete, None);
        return;
    }
    // One side closed its region: it was cancelled (or dropped). Tell the other.
    let active_cancelled = !active.is_open() || shared.status().is_terminal();
    if active_cancelled {
        inner.exposures.finish(
            exposure,
            OperationStatus::Cancelled,
            Some(Error::RemoteCancelled),
        );
    } else {
        active.close();
        shared.fail(Error::RemoteCancelled);
        // Normally already ended by its own cancel; `finish` is idempotent
        // and makes sure no exposure stays bound to a copy that stopped.
        inner
            .exposures
            .finish(exposure, OperationStatus::Cancelled, Some(Error::Cancelled));
    }
}
