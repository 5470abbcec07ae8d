//! The same-process lane: source and destination are regions of this
//! process (two connectors of it: the `local` transport), so the
//! destination's owner copies with a plain `memcpy`, chunk by chunk,
//! through both regions' fences: each chunk is read under the source's
//! lock ([`Region::read_at`]) into the destination's counted copy
//! ([`Region::copy_into`]). The seal is taken under both locks, the
//! source's then the destination's, and seals the source's operation with
//! the destination's where the source has one ([`ProcessPeer::new`]): a
//! close on either side either stops the pull or finds both sealed, and
//! both sides agree on the outcome.
//!
//! A source region that closed (its operation was cancelled or ended) is a
//! source that went away: the pull fails unsealed. Host memory only:
//! device memory between two connectors of one process goes through a
//! host buffer (`local.rs`).

use std::sync::Arc;

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId, MemKinds, Reach};

use super::registration::Nothing;
use super::{Lane, LaneError, LeaseBlob, PullEnd};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::{Denied, Region};

/// Bytes copied by one callback of the destination's region.
pub(crate) const CHUNK: usize = 4 << 20;

/// The same-process lane (see the module).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ProcessPuller;

/// The source, as the destination sees it in this process: its region,
/// and its operation where the source's side is a connector of this
/// process too (sealed with the destination's).
pub(crate) struct ProcessPeer {
    source: Arc<Region>,
    op: Option<Arc<OpShared>>,
}

impl ProcessPeer {
    /// The source that lent `source`; `op`, its operation, is sealed under
    /// both regions' locks with the destination's.
    pub(crate) fn new(source: Arc<Region>, op: Option<Arc<OpShared>>) -> Self {
        ProcessPeer { source, op }
    }
}

/// The same-process lane's id (on no wire: both sides are this process).
pub(crate) const PROCESS_LANE: LaneId = LaneId(0);

/// What a failed same-process copy ends: the one operation (there is no
/// connection).
const SCOPE: FailureScope = FailureScope::Request;

/// A failed pull, with `cause`.
fn failure(cause: LaneError) -> PullEnd {
    PullEnd::failed(SCOPE, cause)
}

/// Why a pull failed when the source's region refused a read.
fn refused(d: Denied) -> PullEnd {
    failure(match d {
        Denied::Closed => LaneError::SourceGone {
            detail: "the source closed its memory".into(),
        },
        Denied::NotHostMemory => LaneError::BadLease {
            detail: "the source is device memory, which this lane does not read (local copies \
                     it through a host buffer)"
                .into(),
        },
        Denied::OutOfBounds => LaneError::LeaseTooLarge,
    })
}

impl Lane for ProcessPuller {
    type Peer = ProcessPeer;
    type Registration = Nothing;

    fn id(&self) -> LaneId {
        PROCESS_LANE
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Local
    }

    fn caps(&self) -> LaneCaps {
        LaneCaps {
            id: PROCESS_LANE,
            lends: MemKinds::HOST,
            pulls_into: MemKinds::HOST,
            reach: Reach::Process,
            within_process: true,
            failure: SCOPE,
            proven_by: PROCESS_LANE,
        }
    }

    fn register(&self, _region: &Region) -> Result<Option<Nothing>, LaneError> {
        Ok(None)
    }

    fn lend(&self, region: &Region, _kept: Option<&Nothing>) -> LeaseBlob {
        LeaseBlob::addresses(PROCESS_LANE, region.segments())
    }

    fn pull(
        &self,
        peer: &ProcessPeer,
        lease: &LeaseBlob,
        region: &Region,
        shared: &OpShared,
    ) -> PullEnd {
        let src = &peer.source;
        // The lease names the source's segments, in order: it reads by
        // index, so anything else was not lent by this source.
        if lease.segments() != src.segments().as_slice() {
            return failure(LaneError::NotLent {
                detail: "the lease is not of the source's memory".into(),
            });
        }
        for (i, &(_, len)) in lease.segments().iter().enumerate() {
            let mut off = 0u64;
            while off < len {
                let n = (len - off).min(CHUNK as u64) as usize;
                let r = src.read_at(i, off, n, |from| {
                    region.copy_into(i, 1, Some((off, n)), |to| {
                        let (to, m) = to[0];
                        debug_assert_eq!(m, from.len());
                        // SAFETY: `to` is `n` bytes of the destination that
                        // `copy_into` reserves for this copy until we
                        // return, valid for writes and touched by nothing
                        // else; `from` is `n` bytes of the source, read
                        // under its lock. They do not overlap: a region
                        // being written is not one being lent.
                        unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), to, m) }
                    })
                });
                match r {
                    Ok(Ok(())) => off += n as u64,
                    Ok(Err(Denied::Closed)) => return PullEnd::Closed,
                    Ok(Err(Denied::NotHostMemory)) => return failure(LaneError::NotHostMemory),
                    Ok(Err(Denied::OutOfBounds)) => return failure(LaneError::LeaseTooLarge),
                    Err(d) => return refused(d),
                }
            }
        }
        if seal_both(src, region, shared, peer.op.as_deref()) {
            PullEnd::Done
        } else if !region.is_open() {
            PullEnd::Closed
        } else {
            // Not sealed, the destination open: the source had closed.
            refused(Denied::Closed)
        }
    }
}

/// Seals `dst_op` (the destination's operation) and `src_op` (the
/// source's, where it is one of this process) under both regions' locks,
/// the source's first, as every copy of this lane takes them: true if both
/// regions were open and the seals ran. The one seal of same-process
/// copies (`local.rs` seals its copies through host buffers with it too).
pub(crate) fn seal_both(
    src: &Region,
    dst: &Region,
    dst_op: &OpShared,
    src_op: Option<&OpShared>,
) -> bool {
    let mut sealed = false;
    src.seal_if_open(|| {
        sealed = dst.seal_if_open(|| {
            dst_op.seal();
            if let Some(op) = src_op {
                op.seal();
            }
        });
    });
    sealed
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use ferry_proto::DeviceKind;

    use super::*;
    use crate::transport::pull::conformance::{
        host_source, Applies, Backend, Mortal, Source, Stalled,
    };
    use crate::transport::pull::uffd;
    use crate::{Descriptor, Device};

    /// The same-process lane between two regions of this process.
    #[derive(Default)]
    struct ProcessBackend(ProcessPuller);

    impl Backend for ProcessBackend {
        type P = ProcessPuller;

        fn puller(&self) -> &ProcessPuller {
            &self.0
        }

        fn chunk(&self, _into: DeviceKind) -> usize {
            CHUNK
        }

        fn source(&self, sizes: &[usize]) -> Source<ProcessPeer> {
            host_source(&self.0, sizes, |src| ProcessPeer::new(src.clone(), None))
        }

        fn mortal_source(&self, sizes: &[usize]) -> Applies<Mortal<ProcessPeer>> {
            let mut lent = None;
            let source = host_source(&self.0, sizes, |src| {
                lent = Some(src.clone());
                ProcessPeer::new(src.clone(), None)
            });
            let lent = lent.expect("the source's region");
            // Its operation ends (a cancel, its connector's shutdown).
            Ok((source, Box::new(move || lent.close())))
        }

        fn stalled_source(&self, len: usize) -> Applies<Stalled<ProcessPeer>> {
            let stall = uffd::Stall::new(len)
                .map_err(|e| format!("userfaultfd refused by this kernel: {e}"))?;
            // SAFETY: the mapping lives in `stall`, dropped in the source's
            // end after the region is closed; written by nobody (its pages
            // arrive, as zeros, when the test serves them).
            let desc = unsafe { Descriptor::from_raw_parts(stall.base, len, Device::CPU, false) };
            // SAFETY: as above.
            let region = Arc::new(unsafe { Region::new(&[desc], false) });
            let lease = self.0.lend(&region, None);
            region.lend();
            let peer = ProcessPeer::new(region.clone(), None);
            Ok(Stalled::over_uffd(lease, peer, region, stall, len))
        }
    }

    mod conformance {
        use super::ProcessBackend;
        use crate::transport::pull::conformance::conformance_tests;

        conformance_tests!(ProcessBackend::default());
    }

    /// The seal covers the source's operation too, under both locks; a
    /// source closed before the seal fails the pull unsealed.
    #[test]
    fn the_seal_covers_both_operations() {
        use crate::transport::pull::conformance::Mem;
        use ferry_proto::OperationStatus;
        let p = ProcessPuller;
        let src = Mem::new(vec![vec![7; 10], vec![8; 3]], false);
        let dst = Mem::new(vec![vec![0; 10], vec![0; 3]], true);
        let (mine, theirs) = (
            OpShared::new(OperationStatus::InProgress),
            OpShared::new(OperationStatus::InProgress),
        );
        let peer = ProcessPeer::new(src.region.clone(), Some(theirs.clone()));
        let lease = p.lend(&src.region, None);
        assert_eq!(p.pull(&peer, &lease, &dst.region, &mine), PullEnd::Done);
        assert!(mine.is_sealed() && theirs.is_sealed());
        assert_eq!(&*dst.bytes(1), &[8; 3]);
        let dst = Mem::new(vec![vec![0; 10], vec![0; 3]], true);
        let (mine, theirs) = (
            OpShared::new(OperationStatus::InProgress),
            OpShared::new(OperationStatus::InProgress),
        );
        let peer = ProcessPeer::new(src.region.clone(), Some(theirs.clone()));
        src.region.close();
        assert!(matches!(
            p.pull(&peer, &lease, &dst.region, &mine),
            PullEnd::Failed { .. }
        ));
        assert!(!mine.is_sealed() && !theirs.is_sealed());
    }
}
