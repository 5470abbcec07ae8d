//! The opaque bytes of a CUDA IPC lease: which device allocations the lent
//! segments lie in (one IPC handle each) and where in them.
//!
//! Version 2, little endian:
//!
//! ```text
//! magic   4 bytes  "FCIP"
//! version u16      2
//! flags   u16      0 (anything else is refused)
//! allocs  u32      allocation count A
//! runs    u32      run count R
//! device  16 bytes the source device's UUID (cuDeviceGetUuid), or zeros
//! A times: handle [u8; 64] (a CUipcMemHandle), size u64 (the allocation's)
//! R times: alloc u32, count u32, offset u64
//! ```
//!
//! A run is `count` segments of the lease, in order, laid end to end in
//! allocation `alloc` from `offset` on (the segments' lengths are the
//! lease's own): the blocks of a pool are one run, a descriptor per
//! allocation one run each. A run of empty segments may name no allocation
//! ([`NO_ALLOC`]). Runs cover the lease's segments exactly, in order.
//!
//! The device is named by UUID, not ordinal: two processes may number one
//! host's GPUs differently (`CUDA_VISIBLE_DEVICES`). A destination copying
//! into host memory opens the handles on that device where it sees it.
//!
//! [`decode`] takes bytes from another process: it never panics, reads each
//! byte once, checks the total length against the counts before it
//! allocates anything, and allocates no more than the lease's segment
//! count (which the wire bounds) and the input's length allow.

use std::fmt;

/// The first bytes of every CUDA IPC lease: how a destination tells it
/// from a cross-memory-attach lease (which has no opaque bytes).
pub(crate) const MAGIC: [u8; 4] = *b"FCIP";
/// The encoding this build writes and reads.
pub(crate) const VERSION: u16 = 2;
/// The allocation index of a run of empty segments, which lie in none.
pub(crate) const NO_ALLOC: u32 = u32::MAX;

const HEADER: usize = 32;
const ALLOC: usize = 64 + 8;
const RUN: usize = 16;

/// One lent allocation: its IPC handle and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Alloc {
    pub(crate) handle: [u8; 64],
    pub(crate) size: u64,
}

/// A decoded lease: the source device, the allocations, and for each
/// segment of the lease (in order) its allocation and offset in it
/// (`NO_ALLOC`, 0 for an empty segment of a run that names none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IpcLease {
    /// The UUID of the device the allocations are on (zeros: not said).
    pub(crate) device: [u8; 16],
    pub(crate) allocs: Vec<Alloc>,
    pub(crate) at: Vec<(u32, u64)>,
}

/// Why opaque bytes are not a CUDA IPC lease of the segments they came with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseError {
    /// Shorter than the header, or than what the counts announce.
    Truncated { len: usize, need: u64 },
    /// Longer than what the counts announce.
    TrailingBytes { len: usize, need: u64 },
    /// Not "FCIP".
    UnknownMagic,
    /// A version (or flags) this build does not read.
    UnknownVersion { version: u16, flags: u16 },
    /// More allocations or runs than the lease has segments.
    TooMany {
        allocs: u32,
        runs: u32,
        segments: usize,
    },
    /// A run of no segments, or one naming an allocation that is not there.
    BadRun { run: usize },
    /// The runs cover `covered` segments; the lease has `segments`.
    CountMismatch { covered: u64, segments: usize },
    /// A segment past the end of its allocation.
    OutOfAllocation { segment: usize },
    /// An allocation that no run uses.
    UnusedAllocation { alloc: usize },
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::Truncated { len, need } => {
                write!(f, "truncated: {len} bytes where {need} are needed")
            }
            LeaseError::TrailingBytes { len, need } => {
                write!(f, "{len} bytes where {need} were announced")
            }
            LeaseError::UnknownMagic => f.write_str("not a CUDA IPC lease (unknown magic)"),
            LeaseError::UnknownVersion { version, flags } => write!(
                f,
                "CUDA IPC lease version {version} (flags {flags:#x}); this build reads \
                 version {VERSION}: upgrade the older side"
            ),
            LeaseError::TooMany {
                allocs,
                runs,
                segments,
            } => write!(
                f,
                "{allocs} allocations and {runs} runs for {segments} segments"
            ),
            LeaseError::BadRun { run } => write!(f, "run {run} is empty or names no allocation"),
            LeaseError::CountMismatch { covered, segments } => write!(
                f,
                "the runs cover {covered} segments, the lease has {segments}"
            ),
            LeaseError::OutOfAllocation { segment } => {
                write!(f, "segment {segment} lies past the end of its allocation")
            }
            LeaseError::UnusedAllocation { alloc } => write!(f, "allocation {alloc} is not used"),
        }
    }
}

/// Encodes the source `device`'s UUID, `allocs` and, for each segment of
/// lengths `lens`, its allocation and offset (`at`, as long as `lens`), as
/// runs: a segment joins the run before it where it lies in the same
/// allocation right after the previous one (or both are empty and in
/// none).
pub(crate) fn encode(
    device: [u8; 16],
    allocs: &[Alloc],
    at: &[(u32, u64)],
    lens: &[u64],
) -> Vec<u8> {
    let mut runs: Vec<(u32, u32, u64)> = Vec::new();
    let mut next: Option<(u32, u64)> = None;
    for (&(alloc, off), &len) in at.iter().zip(lens) {
        match runs.last_mut() {
            Some(run) if next == Some((alloc, off)) && run.1 < u32::MAX => run.1 += 1,
            _ => runs.push((alloc, 1, off)),
        }
        next = Some((alloc, off.saturating_add(len)));
    }
    let mut out = Vec::with_capacity(HEADER + allocs.len() * ALLOC + runs.len() * RUN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(allocs.len() as u32).to_le_bytes());
    out.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    out.extend_from_slice(&device);
    for a in allocs {
        out.extend_from_slice(&a.handle);
        out.extend_from_slice(&a.size.to_le_bytes());
    }
    for (alloc, count, off) in runs {
        out.extend_from_slice(&alloc.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
    }
    out
}

/// Reads fixed-size little-endian fields from a slice whose length was
/// checked first: `take` returns zeros past the end instead of panicking
/// (never reached after the length check).
struct Fields<'a> {
    b: &'a [u8],
    at: usize,
}

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(s) = self.b.get(self.at..self.at.saturating_add(N)) {
            out.copy_from_slice(s);
        }
        self.at = self.at.saturating_add(N);
        out
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// Decodes the opaque bytes of a lease whose segments have lengths `lens`
/// (the lease's own, already matched against the destination), checking
/// that they describe exactly those segments, each inside its allocation.
pub(crate) fn decode(b: &[u8], lens: &[u64]) -> Result<IpcLease, LeaseError> {
    if b.len() < HEADER {
        if !b.is_empty() && !MAGIC.starts_with(&b[..b.len().min(4)]) {
            return Err(LeaseError::UnknownMagic);
        }
        return Err(LeaseError::Truncated {
            len: b.len(),
            need: HEADER as u64,
        });
    }
    let mut f = Fields { b, at: 0 };
    if f.take::<4>() != MAGIC {
        return Err(LeaseError::UnknownMagic);
    }
    let (version, flags) = (f.u16(), f.u16());
    if version != VERSION || flags != 0 {
        return Err(LeaseError::UnknownVersion { version, flags });
    }
    let (allocs, runs) = (f.u32(), f.u32());
    let device = f.take::<16>();
    // Every allocation is used by a run, and every run covers a segment.
    if allocs as usize > lens.len() || runs as usize > lens.len() {
        return Err(LeaseError::TooMany {
            allocs,
            runs,
            segments: lens.len(),
        });
    }
    let need = HEADER as u64 + u64::from(allocs) * ALLOC as u64 + u64::from(runs) * RUN as u64;
    if (b.len() as u64) < need {
        return Err(LeaseError::Truncated { len: b.len(), need });
    }
    if (b.len() as u64) > need {
        return Err(LeaseError::TrailingBytes { len: b.len(), need });
    }
    // Bounded by the input's length (checked above) and the segment count.
    let mut list = Vec::with_capacity(allocs as usize);
    for _ in 0..allocs {
        let handle = f.take::<64>();
        let size = f.u64();
        list.push(Alloc { handle, size });
    }
    let mut used = vec![false; list.len()];
    let mut at = Vec::with_capacity(lens.len());
    for run in 0..runs as usize {
        let (alloc, count, mut off) = (f.u32(), f.u32(), f.u64());
        let size = match list.get(alloc as usize) {
            Some(a) => Some(a.size),
            None if alloc == NO_ALLOC => None,
            None => return Err(LeaseError::BadRun { run }),
        };
        if count == 0 {
            return Err(LeaseError::BadRun { run });
        }
        let covered = at.len() as u64 + u64::from(count);
        if covered > lens.len() as u64 {
            return Err(LeaseError::CountMismatch {
                covered,
                segments: lens.len(),
            });
        }
        for _ in 0..count {
            let segment = at.len();
            let len = lens[segment];
            let end = off.checked_add(len);
            let inside = match size {
                Some(size) => end.is_some_and(|e| e <= size),
                // No allocation: empty segments only.
                None => len == 0,
            };
            if !inside {
                return Err(LeaseError::OutOfAllocation { segment });
            }
            at.push((alloc, off));
            off = end.unwrap_or(off);
        }
        if let Some(u) = used.get_mut(alloc as usize) {
            *u = true;
        }
    }
    if at.len() != lens.len() {
        return Err(LeaseError::CountMismatch {
            covered: at.len() as u64,
            segments: lens.len(),
        });
    }
    if let Some(alloc) = used.iter().position(|u| !u) {
        return Err(LeaseError::UnusedAllocation { alloc });
    }
    Ok(IpcLease {
        device,
        allocs: list,
        at,
    })
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
