//! Device (GPU) memory in band: its bytes go through a host buffer, copied
//! to and from the device by `Region::stage_in` and `Region::stage_out`
//! (`cuda::stage`), which hold the region's lock until the device's copy
//! has finished. The frames are those of host memory; only the last step
//! into or out of the memory differs, so a peer cannot tell (and needs no
//! GPU of its own: a host on the other side reads a GPU's memory as bytes).
#![forbid(unsafe_code)]

use std::io;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

use super::conn_io::{outside, Dst, ZEROS};
use super::error::ConnError;
use crate::cuda::CudaError;
use crate::region::{Denied, Region};

/// The most bytes staged at once: one copy to or from the device per this
/// much payload.
pub(super) const STAGE: usize = 1 << 20;

/// What a failed device copy does to the connection: it is closed, and
/// both sides learn why.
pub(super) fn failed(e: CudaError) -> ConnError {
    ConnError::Channel(failed_text(&e))
}

/// [`land`](super::conn_io) for device memory: copies `src` into the region
/// from `off` of segment `seg` on; where the next byte goes, or `None` if
/// the region closed (the rest is then discarded).
pub(super) fn land_device<'a>(
    region: &'a Region,
    seg: usize,
    off: u64,
    mut src: &[u8],
) -> Result<Dst<'a>, ConnError> {
    let (mut seg, mut off) = (seg, off);
    while !src.is_empty() {
        match region.stage_in(seg, off, src) {
            Ok(Ok(0)) | Err(Denied::OutOfBounds) => return Err(outside()),
            Ok(Ok(n)) => {
                src = &src[n..];
                (seg, off) = region.advance(seg, off, n);
            }
            Ok(Err(e)) => return Err(failed(e)),
            Err(Denied::Closed) => return Ok(None),
            // A device region never answers that; treated as outside.
            Err(Denied::NotHostMemory) => return Err(outside()),
        }
    }
    Ok(Some((region, seg, off)))
}

/// Copies up to `tmp.len()` bytes of the region from `off` of segment
/// `seg` on into `tmp`: how many came (0 only where `tmp` is empty), or
/// `None` if the region is closed.
pub(super) fn read_device(
    region: &Region,
    seg: usize,
    off: u64,
    tmp: &mut [u8],
) -> io::Result<Option<usize>> {
    match region.stage_out(seg, off, tmp) {
        Ok(Ok(n)) => Ok(Some(n)),
        Ok(Err(e)) => Err(io::Error::other(failed_text(&e))),
        Err(Denied::Closed) => Ok(None),
        Err(Denied::OutOfBounds | Denied::NotHostMemory) => Err(io::Error::other(
            "device memory to send lies outside the descriptors",
        )),
    }
}

fn failed_text(e: &CudaError) -> String {
    format!("staging GPU memory through the host failed: {e}")
}

/// [`ConnWriter::send_data`](super::conn_io::ConnWriter::send_data) for
/// device memory, in plaintext: the payload is copied off the device
/// [`STAGE`] bytes at a time into `tmp` and written from there. If the
/// region closes meanwhile, the rest of the payload is zeros and
/// `Ok(false)` is returned; if it was closed before, nothing is sent.
pub(super) async fn send_device(
    w: &mut OwnedWriteHalf,
    tmp: &mut Vec<u8>,
    header: &[u8],
    region: &Region,
    desc: u32,
    offset: u64,
    len: u32,
) -> io::Result<bool> {
    let len = len as usize;
    let (mut seg, mut off) = (desc as usize, offset);
    let (mut started, mut sent, mut open) = (false, 0usize, true);
    while !started || sent < len {
        let n = (len - sent).min(STAGE);
        if open {
            if tmp.len() < n {
                tmp.resize(n, 0);
            }
            match read_device(region, seg, off, &mut tmp[..n])? {
                Some(took) => {
                    if !started {
                        w.write_all(header).await?;
                        started = true;
                    }
                    w.write_all(&tmp[..took]).await?;
                    sent += took;
                    (seg, off) = region.advance(seg, off, took);
                    if took == 0 && n > 0 {
                        return Err(io::Error::other("no device bytes where some were due"));
                    }
                }
                // Closed before the frame started: send nothing of it.
                None if !started => return Ok(false),
                None => open = false,
            }
        } else {
            // Closed mid-frame: complete it with zeros.
            let n = n.min(ZEROS.len());
            w.write_all(&ZEROS[..n]).await?;
            sent += n;
        }
    }
    Ok(open)
}
