//! A same-host lane that reads the peer's lent memory through
//! `/proc/<pid>/mem` (`pread` at the lent address): for hosts where a
//! seccomp filter refuses `process_vm_readv` (cross-memory attach) but
//! lets a process open and read `/proc/<pid>/mem`, which the kernel
//! allows under the same ptrace permission.
//!
//! Off by default (`FERRY_LANES_ON=procmem` turns it on, [`ProcMem::on`]):
//! where it is on, a same-host connection on which cross-memory attach
//! proved nothing spends its four offers more before it settles on TCP.
//!
//! It proves its peer as cross-memory attach does, with the same four
//! offers (`cma/offer.rs`, [`offer::ProcMemExchange`]): a pid that holds this very
//! connection's socket (`probe::owns_socket`), and a cookie read back
//! through the peer's `mem` file. It is offered after `cma` and `ucx`
//! (`exchange.rs`), so it is tried only where neither proved a way, and
//! it rides on nobody's proof nor lends anything a proof of another lane
//! serves: a connection agrees only on the lanes of the lane that proved
//! (`LaneCaps::proven_by`), so no other lane's choice changes.
//!
//! The peer is the `mem` file itself, opened through the process's
//! `/proc/<pid>` directory before the probe: the kernel binds it to the
//! address space the process had when it was opened, so once the process
//! exits or replaces its program (`exec`), a read returns nothing (end of
//! file) and never another program's bytes. Every copy is a read through
//! that file: bytes that arrive come from the image that passed the probe.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId, MemKinds, Reach};

use super::registration::Nothing;
use super::{Lane, LaneError, LeaseBlob, PullEnd};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::{Denied, Region};
use crate::transport::cma;

pub(crate) mod offer;

/// How many bytes one copy moves at most (rule 2: how long a cancel waits
/// for an ordinary copy): cross-memory attach's chunk.
const CHUNK: usize = cma::CHUNK;

/// What a failed copy ends: the connection (the source went away, or lent
/// memory it does not have).
const SCOPE: FailureScope = FailureScope::Connection;

/// The lane. A lease is the `(address, length)` of each source segment in
/// the source process, as cross-memory attach's; the peer is that
/// process's `mem` file ([`Peer`]).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ProcMem;

impl ProcMem {
    /// The lane's name in `FERRY_LANES_ON`.
    pub(crate) const NAME: &'static str = "procmem";

    /// Whether this process offers the lane: `FERRY_LANES_ON` names it
    /// (always in this crate's own tests, which run its exchange).
    pub(crate) fn on() -> bool {
        cfg!(test) || crate::config::process().lane_on(Self::NAME)
    }
}

/// A process this one proved and reads from: its `/proc/<pid>/mem`, bound
/// to the address space it had when the file was opened.
pub(crate) struct Peer {
    pid: u32,
    mem: OwnedFd,
}

impl Peer {
    /// Opens the `mem` file of the process whose `/proc/<pid>` directory is
    /// `dir` (the kernel checks the ptrace permission here, once).
    pub(crate) fn open(pid: u32, dir: &OwnedFd) -> io::Result<Peer> {
        Ok(Peer {
            pid,
            mem: cma::open_in(dir, c"mem", 0)?,
        })
    }

    /// The process's id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Reads `len` bytes at `remote` of the peer into `local`. Blocking.
    /// A read of nothing (the address space is gone: the process exited or
    /// replaced its program) is [`io::ErrorKind::UnexpectedEof`].
    ///
    /// # Safety
    ///
    /// `local` is valid for writes of `len` bytes, and nothing else
    /// touches them during the call.
    pub(crate) unsafe fn read(&self, local: *mut u8, len: usize, remote: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < len {
            let at = remote
                .checked_add(done as u64)
                .and_then(|a| i64::try_from(a).ok())
                .ok_or_else(|| io::Error::other("a lent address out of range"))?;
            // SAFETY: `local + done .. local + len` lies inside what the
            // caller vouched for (valid for writes, touched by nothing
            // else); `mem` is an open file of ours.
            let n = unsafe {
                libc::pread64(self.mem.as_raw_fd(), local.add(done).cast(), len - done, at)
            };
            match n {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the process exited or replaced its program",
                    ))
                }
                n if n > 0 => done += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }
}

impl Lane for ProcMem {
    type Peer = Peer;
    type Registration = Nothing;

    fn id(&self) -> LaneId {
        LaneId::PROCMEM
    }

    /// It reports as cross-memory attach: one copy between processes of
    /// one host, by address.
    fn kind(&self) -> TransportKind {
        TransportKind::Cma
    }

    fn caps(&self) -> LaneCaps {
        LaneCaps {
            id: LaneId::PROCMEM,
            lends: MemKinds::HOST,
            pulls_into: MemKinds::HOST,
            reach: Reach::Host,
            within_process: true,
            failure: SCOPE,
            proven_by: LaneId::PROCMEM,
        }
    }

    /// Nothing to register: the kernel reads the source's pages as they are.
    fn register(&self, _region: &Region) -> Result<Option<Nothing>, LaneError> {
        Ok(None)
    }

    fn lend(&self, region: &Region, _kept: Option<&Nothing>) -> LeaseBlob {
        LeaseBlob::addresses(LaneId::PROCMEM, region.segments())
    }

    /// Copies every segment of the lease, [`CHUNK`] bytes at most per
    /// read, each inside one `Region::copy_into` (rules 1 to 3: the first
    /// refusal ends the pull `Closed`), then seals under the region's lock
    /// (rule 4). A read that fails or finds the address space gone fails
    /// the pull in connection scope, unsealed (rule 5).
    fn pull(&self, peer: &Peer, lease: &LeaseBlob, region: &Region, shared: &OpShared) -> PullEnd {
        let pid = peer.pid();
        if !region.is_host() {
            return PullEnd::failed(SCOPE, LaneError::NotHostMemory);
        }
        for (seg, &(addr, len)) in lease.segments().iter().enumerate() {
            let mut off = 0u64;
            while off < len {
                let n = (len - off).min(CHUNK as u64) as usize;
                let Some(at) = addr.checked_add(off) else {
                    return PullEnd::failed(
                        SCOPE,
                        LaneError::BadLease {
                            detail: "a lease address overflows".into(),
                        },
                    );
                };
                // SAFETY: `copy_into` hands out `n` bytes at `off` of
                // segment `seg` (bounds checked), counted as in flight
                // until we return: valid for writes and touched by nothing
                // else meanwhile; one range of exactly `n` bytes.
                let r = region.copy_into(seg, 1, Some((off, n)), |local| match local {
                    [(p, m)] if *m == n => unsafe { peer.read(*p, n, at) },
                    _ => Err(io::Error::other("lease larger than the destination")),
                });
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return PullEnd::failed(
                            SCOPE,
                            LaneError::SourceGone {
                                detail: format!("process {pid}: {e}"),
                            },
                        )
                    }
                    Ok(Err(e)) => {
                        return PullEnd::failed(
                            SCOPE,
                            LaneError::Copy {
                                detail: format!("reading /proc/{pid}/mem failed: {e}"),
                            },
                        )
                    }
                    Err(Denied::Closed) => return PullEnd::Closed,
                    Err(Denied::NotHostMemory) => {
                        return PullEnd::failed(SCOPE, LaneError::NotHostMemory)
                    }
                    Err(Denied::OutOfBounds) => {
                        return PullEnd::failed(SCOPE, LaneError::LeaseTooLarge)
                    }
                }
                off += n as u64;
            }
        }
        if region.seal_if_open(|| shared.seal()) {
            PullEnd::Done
        } else {
            PullEnd::Closed
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests;
