//! Device (GPU) memory in band: its bytes go through host buffers, copied
//! to and from the device by `Region::stage_in` and `Region::stage_out`
//! (`cuda::stage`), which hold the region's lock until the device's copy
//! has finished. The frames are those of host memory; only the last step
//! into or out of the memory differs, so a peer cannot tell (and needs no
//! GPU of its own: a host on the other side reads a GPU's memory as bytes).
//!
//! Both directions are pipelined, two host buffers deep: the copy to or
//! from the device runs on a blocking thread ([`Landing`](super::land::Landing), [`Staging`])
//! while the connection's task moves the previous (or next) buffer through
//! the socket. Each copy is one locked region access, so the fence is that
//! of host memory: once `Region::close` has returned, no copy starts, and
//! the one running has ended (close waits for the lock).
//!
//! A copy the driver fails ends its one request, both sides told
//! ([`Conn::fail_request`]: `Error::DeviceCopy` here, `Abort(DeviceMemory)`
//! to the peer); the connection and its other requests go on.
#![forbid(unsafe_code)]

use std::io;
use std::sync::Arc;

use ferry_proto::wire::{AbortReason, Data, Message};
use ferry_proto::{Cursor, OperationStatus};
use tokio::task::JoinHandle;

use super::conn::Conn;
use super::conn_io::ConnWriter;
use super::land::{failed_text, host_buf, DeviceCopyFailed, INLINE};
use super::request::Target;
use super::util::{lock, CHUNK};
use crate::cuda::stage::HostBuf;
use crate::region::{Denied, Region};

impl Conn {
    /// Ends request `req` after a failed device copy: forgotten by the
    /// session (its further `Data` is discarded), the operation errored
    /// with `Error::DeviceCopy` (its region closed first), and the peer told
    /// with `Abort(DeviceMemory)` unless the operation had ended already.
    /// A striped transfer's parts are told by its stripe instead, each once
    /// (`Abort(PartFailed)` with this error's text).
    pub(super) fn fail_request(self: &Arc<Self>, req: u64, target: &Target, why: String) {
        tracing::warn!(peer = self.peer, req, "{why}");
        lock(&self.session).forget(req);
        let error = crate::Error::DeviceCopy {
            reason: why.clone(),
        };
        if target.end(OperationStatus::Errored, Some(error)) && target.stripe.is_none() {
            self.abort_detached(req, AbortReason::DeviceMemory, why);
        }
    }
}

/// Fills all of `dst` from the region, from `off` of segment `seg` on:
/// `Ok(false)` if the region is (or became) closed.
fn fill_from_device(region: &Region, seg: usize, off: u64, dst: &mut [u8]) -> io::Result<bool> {
    let (mut seg, mut off, mut at) = (seg, off, 0);
    while at < dst.len() {
        match region.stage_out(seg, off, &mut dst[at..]) {
            Ok(Ok(0)) => return Err(io::Error::other("no device bytes where some were due")),
            Ok(Ok(n)) => {
                at += n;
                (seg, off) = region.advance(seg, off, n);
            }
            Ok(Err(e)) => return Err(io::Error::other(DeviceCopyFailed(failed_text(&e)))),
            Err(Denied::Closed) => return Ok(false),
            Err(Denied::OutOfBounds | Denied::NotHostMemory) => {
                return Err(io::Error::other(
                    "device memory to send lies outside the descriptors",
                ))
            }
        }
    }
    Ok(true)
}

/// One frame's bytes being copied off the device on a blocking thread:
/// the span, its buffer, and whether the region was still open.
struct Staging {
    span: (u32, u64, u32),
    job: Job,
}

/// A copy off the device: run already (a small one), or running.
enum Job {
    Done((HostBuf, io::Result<bool>)),
    Running(JoinHandle<(HostBuf, io::Result<bool>)>),
}

impl Staging {
    /// Starts copying `span` off the device: on a blocking thread, or at
    /// once on this task where it is small or `first` (nothing is being
    /// written that it could overlap).
    fn start(
        region: &Arc<Region>,
        span: (u32, u64, u32),
        kept: Option<HostBuf>,
        first: bool,
    ) -> Self {
        let n = span.2 as usize;
        let buf = match kept {
            // A small copy needs no pinned frame-sized buffer of its own.
            None if n < INLINE => HostBuf::Plain(vec![0; n]),
            kept => host_buf(region, kept, CHUNK as usize),
        };
        let copy = move |region: &Region, mut buf: HostBuf| {
            let r = fill_from_device(region, span.0 as usize, span.1, &mut buf[..n]);
            (buf, r)
        };
        let job = if n < INLINE || first {
            Job::Done(copy(region, buf))
        } else {
            let region = region.clone();
            Job::Running(tokio::task::spawn_blocking(move || copy(&region, buf)))
        };
        Staging { span, job }
    }

    async fn wait(self) -> io::Result<((u32, u64, u32), HostBuf, bool)> {
        let (buf, r) = match self.job {
            Job::Done(done) => done,
            Job::Running(job) => job
                .await
                .map_err(|e| io::Error::other(format!("a device copy failed: {e}")))?,
        };
        Ok((self.span, buf, r?))
    }
}

impl Conn {
    /// Sends the device memory under `cursor` as `Data` frames of up to
    /// [`CHUNK`] bytes, each copied off the device while the previous one
    /// is written. `Ok(false)` if the region closed on the way: the frame
    /// whose copy found it closed, and those after it, are not sent (a
    /// frame already copied still is: its bytes were read before the
    /// close, whole).
    pub(super) async fn stream_device(
        &self,
        req: u64,
        region: &Arc<Region>,
        cursor: &mut Cursor,
    ) -> io::Result<bool> {
        let next_span = |cursor: &mut Cursor| {
            let span = cursor.next_span(CHUNK)?;
            let _ = cursor.accept(span.0, span.1, span.2);
            Some(span)
        };
        let take = || lock(&self.staging).pop();
        let mut next = next_span(cursor).map(|s| Staging::start(region, s, take(), true));
        while let Some(staging) = next.take() {
            let ((desc, offset, len), buf, open) = staging.wait().await?;
            if !open {
                return Ok(false);
            }
            next = next_span(cursor).map(|s| Staging::start(region, s, take(), false));
            let header = Message::Data(Data {
                req,
                desc,
                offset,
                len,
            })
            .to_vec();
            self.unless_dead(async {
                let mut w = self.writer.lock().await;
                send_staged(&mut w, &header, &buf[..len as usize]).await
            })
            .await?;
            let mut kept = lock(&self.staging);
            if kept.len() < 2 && buf.len() >= CHUNK as usize {
                kept.push(buf);
            }
        }
        Ok(true)
    }
}

/// Writes one whole frame whose payload is already in host memory.
async fn send_staged(w: &mut ConnWriter, header: &[u8], payload: &[u8]) -> io::Result<()> {
    w.write_all(header).await?;
    w.write_all(payload).await
}
