//! The bytes a connection sends: whole small transfers in one write, larger
//! ones in chunks from a task of their own, and the final frame that seals
//! the operation as its first byte enters the socket.

use std::io;
use std::sync::Arc;

use ferry_proto::session::{Last as SessionLast, Start};
use ferry_proto::wire::{Abort, AbortReason, Data, Digest, Lease, Message};
use ferry_proto::Cursor;
use tokio::sync::watch;

use crate::outcome::OpShared;
use crate::region::Region;

use super::conn_io::*;
use super::land::device_failure;
use super::request::*;
use super::util::*;
use crate::transport::digest::Running;

use super::conn::*;

impl Conn {
    /// Begins active request `req` as the session said.
    pub(super) fn begin(
        self: &Arc<Self>,
        req: u64,
        target: Target,
        start: Start,
        opened: Option<Arc<watch::Sender<bool>>>,
    ) {
        match start {
            Start::Open(open) => self.send_soon(open.to_vec(), opened, false),
            Start::OpenAndLease(open, lane) => {
                let mut frames = open.to_vec();
                let (lane, segments, key) = self.lease_of(lane, &target.region).into_parts();
                Message::Lease(Lease {
                    req,
                    lane,
                    segments: segments.into(),
                    key,
                })
                .encode(&mut frames);
                self.send_soon(frames, opened, false);
            }
            Start::Stream { open, cursor, last } => {
                self.stream_from(req, target, cursor, open.to_vec(), opened, last)
            }
        }
    }

    /// Streams the bytes under `cursor` after `prefix` (an `Open`), ending
    /// as `last` says: a whole transfer that is small goes out at once.
    pub(super) fn stream_from(
        self: &Arc<Self>,
        req: u64,
        target: Target,
        cursor: Cursor,
        prefix: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
        last: SessionLast,
    ) {
        if let Some(device) = target.region.device() {
            if !crate::cuda::available() {
                return self.refuse_in_band(req, target, device, prefix, opened);
            }
        }
        let last = match (last, &target.stripe) {
            (SessionLast::Seal, _) => {
                return self.spawn_stream(req, target, cursor, prefix, opened);
            }
            (SessionLast::Part, _) => Last::Part,
            (SessionLast::SealAfterParts, Some(s)) => Last::SealAfter(s.clone()),
            // Not striped after all: cannot happen (the session says so
            // only for a striped request); seal as usual.
            (SessionLast::SealAfterParts, None) => Last::Seal,
        };
        self.spawn_part(req, target, cursor, prefix, opened, last);
    }

    /// The net behind the session and the exposure table, which refuse a
    /// request that would stream device memory before it exists: ends the
    /// operation (`NoDeviceTransport`) and tells the peer after `prefix`
    /// (an `Open`) with `Abort(DeviceMemory)`, sending no byte of it.
    fn refuse_in_band(
        self: &Arc<Self>,
        req: u64,
        target: Target,
        device: ferry_proto::Device,
        prefix: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
    ) {
        let reason = ferry_proto::session::DEVICE_MEMORY_BY_IPC_ONLY;
        tracing::warn!(peer = self.peer, req, "refused to stream device memory");
        lock(&self.session).forget(req);
        target.end(
            ferry_proto::OperationStatus::Errored,
            Some(crate::Error::NoDeviceTransport {
                index: 0,
                device,
                reason: reason.into(),
            }),
        );
        let mut frames = prefix;
        Message::Abort(Abort {
            req,
            reason: AbortReason::DeviceMemory,
            detail: reason.into(),
        })
        .encode(&mut frames);
        self.send_soon(frames, opened, false);
    }

    /// Writes the last frame of a transfer (its `Finish`, or a whole small
    /// transfer), sealing the operation under the region's lock at the
    /// moment its first byte enters the socket: a cancel either comes first
    /// (nothing of the frame is sent: `Ok(false)`) or finds the operation
    /// sealed, so the two sides cannot disagree; and while the socket is
    /// full, the operation is not sealed, so a cancel still ends it.
    pub(super) async fn write_final(
        &self,
        w: &mut ConnWriter,
        region: &Region,
        shared: &OpShared,
        frame: &[u8],
    ) -> io::Result<bool> {
        loop {
            w.writable().await?;
            let Some(r) = try_write_sealed(w, region, shared, frame) else {
                return Ok(false);
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    w.write_all(&frame[n..]).await?;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one `Data` frame with its payload taken from the region. If the
    /// region closes meanwhile, the rest of the payload is zeros (the frame
    /// must be completed) and `Ok(false)` is returned.
    pub(super) async fn send_chunk(
        &self,
        req: u64,
        region: &Region,
        desc: u32,
        offset: u64,
        len: u32,
    ) -> io::Result<bool> {
        self.unless_dead(self.send_chunk_inner(req, region, desc, offset, len))
            .await
    }

    pub(super) async fn send_chunk_inner(
        &self,
        req: u64,
        region: &Region,
        desc: u32,
        offset: u64,
        len: u32,
    ) -> io::Result<bool> {
        let header = Message::Data(Data {
            req,
            desc,
            offset,
            len,
        })
        .to_vec();
        let mut w = self.writer.lock().await;
        w.send_data(&header, region, desc, offset, len).await
    }

    /// Sends `prefix`, then the bytes of the region under `cursor` as `Data`
    /// frames, then `Finish` as `last` says. Returns `Ok(false)` if the
    /// region closed on the way (the remote is then told with an `Abort`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn stream(
        self: &Arc<Self>,
        req: u64,
        region: &Arc<Region>,
        cursor: Cursor,
        prefix: Vec<u8>,
        opened: Option<&watch::Sender<bool>>,
        shared: &OpShared,
        last: Last,
    ) -> io::Result<bool> {
        let r = self
            .stream_inner(req, region, cursor, &prefix, opened, shared, last)
            .await;
        if let Some(o) = opened {
            o.send_replace(true);
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn stream_inner(
        self: &Arc<Self>,
        req: u64,
        region: &Arc<Region>,
        mut cursor: Cursor,
        prefix: &[u8],
        opened: Option<&watch::Sender<bool>>,
        shared: &OpShared,
        last: Last,
    ) -> io::Result<bool> {
        let striped = !matches!(last, Last::Seal);
        let closed = |conn: &Arc<Conn>| {
            // A striped operation's remote is told by whoever ended it,
            // with how it ended (the region closes for a failed part too).
            if !striped {
                conn.abort_detached(req, AbortReason::Cancelled, String::new());
            }
            Ok(false)
        };
        if !prefix.is_empty() {
            self.send_frame(prefix).await?;
        }
        if let Some(o) = opened {
            o.send_replace(true);
        }
        if !region.is_host() {
            // Device memory: copied off the device a frame ahead.
            if !self.stream_device(req, region, &mut cursor).await? {
                return closed(self);
            }
        }
        // With the integrity check on, each chunk is digested just before
        // it goes out (it is then in cache for the socket's copy); device
        // memory is not (`None`: not checked).
        let mut digest = (self.digest && region.is_host()).then(Running::default);
        // Each frame as large as a chunk, over as many blocks as it takes.
        while let Some((d, o, l)) = cursor.next_span(CHUNK) {
            if let Some(h) = digest.as_mut() {
                if !h.add(region, d, o, l) {
                    return closed(self);
                }
            }
            if !self.send_chunk(req, region, d, o, l).await? {
                return closed(self);
            }
            let _ = cursor.accept(d, o, l);
        }
        let mut fin = Vec::new();
        if self.digest {
            let crc32 = digest.map(Running::value);
            Message::Digest(Digest { req, crc32 }).encode(&mut fin);
        }
        Message::Finish { req }.encode(&mut fin);
        match last {
            Last::Seal => {}
            Last::Part => {
                // Not the commit: the destination confirms it, and part 0's
                // sealing `Finish` waits for that.
                lock(&self.session).part_sent(req);
                self.send_frame(&fin).await?;
                return Ok(true);
            }
            Last::SealAfter(stripe) => {
                let mut done = stripe.done.subscribe();
                let confirmed = self
                    .unless_dead(async {
                        tokio::select! {
                            _ = until(&mut done, |n| *n + 1 >= stripe.parts) => Ok(true),
                            // Ended meanwhile (a cancel, another part
                            // failed): whoever ended it told the remote.
                            _ = shared.ended() => Ok(false),
                        }
                    })
                    .await?;
                if !confirmed {
                    return Ok(false);
                }
            }
        }
        let sent = self
            .unless_dead(async {
                let mut w = self.writer.lock().await;
                self.write_final(&mut w, region, shared, &fin).await
            })
            .await?;
        if !sent {
            return closed(self);
        }
        Ok(true)
    }

    /// Appends a whole small transfer (data frames and `Finish`) to `out`;
    /// `false` if the region is closed.
    pub(super) fn small_frames(
        req: u64,
        region: &Region,
        mut cursor: Cursor,
        out: &mut Vec<u8>,
        digest: bool,
    ) -> bool {
        let mut h = digest.then(Running::default);
        let total: u64 = cursor.sizes().iter().sum();
        out.reserve(total as usize + 64);
        // One frame for all of it, whatever the blocks.
        while let Some((d, o, l)) = cursor.next_span(u32::MAX) {
            Message::Data(Data {
                req,
                desc: d,
                offset: o,
                len: l,
            })
            .encode(out);
            let (mut seg, mut off, mut left) = (d as usize, o, l as usize);
            while left > 0 {
                let copied = region.read_span(seg, off, left, |pieces| {
                    pieces.iter().fold(0, |n, p| {
                        out.extend_from_slice(p);
                        if let Some(h) = h.as_mut() {
                            // Digested as it is copied into the frame.
                            h.update(p);
                        }
                        n + p.len()
                    })
                });
                match copied {
                    Ok(n) if n > 0 => {
                        left -= n;
                        (seg, off) = region.advance(seg, off, n);
                    }
                    _ => return false,
                }
            }
            let _ = cursor.accept(d, o, l);
        }
        if let Some(h) = h {
            let crc32 = Some(h.value());
            Message::Digest(Digest { req, crc32 }).encode(out);
        }
        Message::Finish { req }.encode(out);
        true
    }

    /// Streams the region: a small transfer goes out at once as one write,
    /// a larger one from a task of its own. A write failure kills the
    /// connection.
    pub(super) fn spawn_stream(
        self: &Arc<Self>,
        req: u64,
        target: Target,
        cursor: Cursor,
        prefix: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
    ) {
        let (region, shared) = (target.region.clone(), target.shared.clone());
        // Device memory goes through a host buffer a frame at a time
        // (`send_data`), never in the one-write path.
        if cursor.sizes().iter().sum::<u64>() <= SMALL && region.is_host() {
            // Cancelled before a byte went out: still send the `Open` (if
            // this is a write) followed by the `Abort`, so that the remote
            // learns of the cancel as it would mid-transfer.
            let mut cancelled = prefix.clone();
            Message::Abort(Abort {
                req,
                reason: AbortReason::Cancelled,
                detail: String::new(),
            })
            .encode(&mut cancelled);
            let mut frame = prefix;
            let aborted = move |conn: &Arc<Conn>, opened: &Option<Arc<watch::Sender<bool>>>| {
                conn.send_soon(cancelled, opened.clone(), false);
            };
            if !Self::small_frames(req, &region, cursor, &mut frame, self.digest) {
                return aborted(self, &opened);
            }
            // Fast path: the whole transfer in one system call, now.
            if let Ok(mut guard) = self.writer.clone().try_lock_owned() {
                let Some(r) = try_write_sealed(&mut guard, &region, &shared, &frame) else {
                    return aborted(self, &opened);
                };
                match r {
                    Ok(n) if n == frame.len() && guard.flushed() => return mark_opened(&opened),
                    Ok(n) if n > 0 => {
                        let conn = self.clone();
                        self.handle.spawn(async move {
                            let r = conn.unless_dead(guard.write_all(&frame[n..])).await;
                            mark_opened(&opened);
                            if let Err(e) = r {
                                conn.kill(format!("write failed: {e}"));
                            }
                        });
                        return;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        mark_opened(&opened);
                        return self.kill(format!("write failed: {e}"));
                    }
                }
            }
            let conn = self.clone();
            self.handle.spawn(async move {
                let r = conn
                    .unless_dead(async {
                        let mut w = conn.writer.lock().await;
                        conn.write_final(&mut w, &region, &shared, &frame).await
                    })
                    .await;
                match r {
                    Ok(true) => mark_opened(&opened),
                    Ok(false) => aborted(&conn, &opened),
                    Err(e) => {
                        mark_opened(&opened);
                        conn.kill(format!("write failed: {e}"));
                    }
                }
            });
            return;
        }
        self.spawn_part(req, target, cursor, prefix, opened, Last::Seal);
    }

    /// Streams the bytes under `cursor` from a task of its own, ending as
    /// `last` says. A write failure kills the connection; a failed copy off
    /// the device ends this request alone (`Conn::fail_request`).
    pub(super) fn spawn_part(
        self: &Arc<Self>,
        req: u64,
        target: Target,
        cursor: Cursor,
        prefix: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
        last: Last,
    ) {
        let conn = self.clone();
        self.handle.spawn(async move {
            let r = conn
                .stream(
                    req,
                    &target.region,
                    cursor,
                    prefix,
                    opened.as_deref(),
                    &target.shared,
                    last,
                )
                .await;
            match r {
                Ok(_) => {}
                Err(e) => match device_failure(&e) {
                    Some(why) => conn.fail_request(req, &target, why),
                    None => conn.kill(format!("write failed: {e}")),
                },
            }
        });
    }
}
