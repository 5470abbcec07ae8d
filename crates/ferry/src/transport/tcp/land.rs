//! Where the payload bytes a connection receives land: straight into host
//! memory, or into device memory through host buffers (`Region::stage_in`,
//! copied on a blocking thread while the reader reads on: [`Landing`]).
//! A place a payload may not go (outside the descriptors, device memory
//! reached through a host access) ends the connection; a region that
//! closed takes the rest of the payload as discarded.
#![forbid(unsafe_code)]

use std::io;
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::error::ConnError;
use crate::cuda::stage::HostBuf;
use crate::cuda::CudaError;
use crate::region::{Denied, Region};

pub(super) fn outside() -> ConnError {
    ConnError::Channel("data outside the descriptors".into())
}

/// In-band bytes for device memory that reached a host access: never
/// landed (the host would dereference GPU memory). Device regions take
/// `land_device`; this is the safety net behind it.
pub(super) fn not_host() -> ConnError {
    ConnError::Channel("data frames for device memory reached a host access".into())
}

/// A payload's destination: the region, and where in it the next byte goes.
pub(super) type Dst<'a> = Option<(&'a Region, usize, u64)>;

/// Copies `src` into the region from `off` of segment `seg` on, into the
/// segments that follow: where the next byte goes, or `None` if the
/// region closed (the rest is then discarded).
pub(super) fn land<'a>(
    region: &'a Region,
    seg: usize,
    off: u64,
    mut src: &[u8],
    fail: Option<&OnFail>,
) -> Result<Dst<'a>, ConnError> {
    if !region.is_host() {
        return land_device(region, seg, off, src, fail);
    }
    let (mut seg, mut off) = (seg, off);
    while !src.is_empty() {
        let r = region.write_span(seg, off, src.len(), |d| {
            let mut n = 0;
            for piece in d.iter_mut() {
                let k = piece.len();
                piece.copy_from_slice(&src[n..n + k]);
                n += k;
            }
            n
        });
        match r {
            Ok(0) | Err(Denied::OutOfBounds) => return Err(outside()),
            Err(Denied::NotHostMemory) => return Err(not_host()),
            Ok(n) => {
                src = &src[n..];
                (seg, off) = region.advance(seg, off, n);
            }
            Err(Denied::Closed) => return Ok(None),
        }
    }
    Ok(Some((region, seg, off)))
}

/// The most bytes landed at once on the receiving side: one copy to the
/// device per this much payload.
pub(super) const STAGE: usize = 1 << 20;

/// Copies smaller than this run on the connection's task: handing them to
/// a blocking thread would cost more than it overlaps.
pub(super) const INLINE: usize = 64 * 1024;

/// A host buffer of at least `len` bytes for device memory of `region`:
/// `kept`, if it is large enough, else a new one.
pub(super) fn host_buf(region: &Region, kept: Option<HostBuf>, len: usize) -> HostBuf {
    match kept {
        Some(b) if b.len() >= len => b,
        _ => {
            let device = region.device().map_or(0, |d| d.id());
            HostBuf::new(device, len)
        }
    }
}

/// Ends the one request whose received bytes could not be copied into
/// device memory, given why (see `Conn::fail_request` in `staged.rs`).
pub(super) type OnFail = Arc<dyn Fn(String) + Send + Sync>;

pub(super) fn failed_text(e: &CudaError) -> String {
    format!("staging GPU memory through the host failed: {e}")
}

/// A copy off the device failed: the sending side's error, which ends its
/// request rather than the connection ([`device_failure`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct DeviceCopyFailed(pub(super) String);

/// Why a device copy failed, where `e` says one did.
pub(super) fn device_failure(e: &io::Error) -> Option<String> {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<DeviceCopyFailed>())
        .map(|f| f.0.clone())
}

/// [`land`] for device memory: copies `src` into the region
/// from `off` of segment `seg` on; where the next byte goes, or `None` if
/// the region closed (the rest is then discarded). A failed copy ends the
/// request through `fail` (then `None`), or the connection without one.
pub(super) fn land_device<'a>(
    region: &'a Region,
    seg: usize,
    off: u64,
    mut src: &[u8],
    fail: Option<&OnFail>,
) -> Result<Dst<'a>, ConnError> {
    let (mut seg, mut off) = (seg, off);
    while !src.is_empty() {
        match region.stage_in(seg, off, src) {
            Ok(Ok(0)) | Err(Denied::OutOfBounds) => return Err(outside()),
            Ok(Ok(n)) => {
                src = &src[n..];
                (seg, off) = region.advance(seg, off, n);
            }
            Ok(Err(e)) => match fail {
                Some(fail) => {
                    fail(failed_text(&e));
                    return Ok(None);
                }
                None => return Err(ConnError::Channel(failed_text(&e))),
            },
            Err(Denied::Closed) => return Ok(None),
            // A device region never answers that; treated as outside.
            Err(Denied::NotHostMemory) => return Err(outside()),
        }
    }
    Ok(Some((region, seg, off)))
}

/// A buffer of received bytes on its way into device memory, copied on a
/// blocking thread while the reader reads on (a small one at once, on the
/// reader's task). Dropped unawaited (the connection ended), the copy
/// still runs to its end, under the region's lock like any other, or finds
/// the region closed.
pub(super) enum Landing {
    Done(HostBuf, Result<(), ConnError>),
    Running(JoinHandle<(HostBuf, Result<(), ConnError>)>),
}

impl Landing {
    /// Starts copying `buf[..n]` into `region` from `off` of segment `seg`
    /// on; a failed copy ends the request through `fail`.
    pub(super) fn start(
        region: &Arc<Region>,
        (seg, off): (usize, u64),
        buf: HostBuf,
        n: usize,
        fail: Option<OnFail>,
    ) -> Self {
        if n < INLINE {
            let r = land_device(region, seg, off, &buf[..n], fail.as_ref()).map(|_| ());
            return Landing::Done(buf, r);
        }
        let region = region.clone();
        Landing::Running(tokio::task::spawn_blocking(move || {
            let r = land_device(&region, seg, off, &buf[..n], fail.as_ref()).map(|_| ());
            (buf, r)
        }))
    }

    /// Waits for the copy: its buffer back (unless the copy panicked), and
    /// how it went.
    pub(super) async fn wait(self) -> (Option<HostBuf>, Result<(), ConnError>) {
        match self {
            Landing::Done(buf, r) => (Some(buf), r),
            Landing::Running(job) => match job.await {
                Ok((buf, r)) => (Some(buf), r),
                Err(e) => (
                    None,
                    Err(ConnError::Channel(format!("a device copy failed: {e}"))),
                ),
            },
        }
    }
}
