//! The two byte streams of a TCP connection: [`FrameReader`] reads frames,
//! [`ConnWriter`] writes them, both either in plaintext or through the
//! secure channel (`secure.rs`) once the handshake has set it up.
//!
//! In plaintext, payload bytes go from the socket straight into the
//! destination memory and from the source memory straight into the socket.
//! Through the secure channel, a received message is authenticated before
//! any of its bytes reach operation memory (decrypted into a buffer, then
//! copied), and sent bytes are encrypted from the source memory into the
//! ciphertext buffer.
#![forbid(unsafe_code)]

use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_proto::wire::{self, Expect, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::error::ConnError;
use super::land::{host_buf, land, not_host, outside, Dst, Landing, OnFail, STAGE};
use super::secure::{Opener, Sealer};
use crate::cuda::stage::HostBuf;
use crate::region::{Denied, Region};

/// A new reader's buffer: room for the largest valid first frame (a
/// `Hello`) and a handshake message, so that nothing grows before a peer
/// has said hello.
const INITIAL: usize = 2 * 1024;
/// What the buffer grows to as bytes stream in (a read that fills it), and
/// returns to after a larger frame.
const DEFAULT: usize = 64 * 1024;
/// A header and the largest body (a `Lease`'s).
const MAX_FRAME: usize = wire::HEADER_LEN + wire::MAX_LEASE_BODY as usize;
/// Payloads from this size on switch the reader to bulk mode.
const BULK_PAYLOAD: u32 = 32 * 1024;
/// How far a bulk-mode reader reads past the bytes it needs.
const BULK_READ_AHEAD: usize = 512;
/// The most plaintext the secure writer encrypts before it writes.
const BATCH: usize = 256 * 1024;
pub(super) static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Reads frames, keeping a buffer for headers and small bodies. The buffer
/// grows with bytes received, never with bytes announced, and shrinks back
/// after a large frame.
pub(crate) struct FrameReader {
    rd: OwnedReadHalf,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The stream carries large payloads: read headers without reading far
    /// ahead, so that payload bytes go from the socket straight into their
    /// destination instead of through `buf`.
    bulk: bool,
    /// No frame has been read yet: the first must be a `Hello` (any other
    /// type is refused from its header), so it may not be larger than the
    /// largest one.
    first: bool,
    /// The secure channel, once set up.
    sec: Option<Box<Opener>>,
    /// Host buffers for payload bytes on their way to device memory
    /// (see `staged.rs`): at most two, one filling while the other lands.
    free: Vec<HostBuf>,
    /// The copy into device memory running while the next bytes are read.
    landing: Option<Landing>,
    /// When bytes last arrived (`util::now_ms`): any byte shows the peer
    /// alive (`session::liveness`).
    heard: Arc<AtomicU64>,
}

impl FrameReader {
    pub(crate) fn new(rd: OwnedReadHalf) -> Self {
        FrameReader {
            rd,
            buf: vec![0; INITIAL],
            start: 0,
            end: 0,
            bulk: false,
            first: true,
            sec: None,
            free: Vec::new(),
            landing: None,
            heard: Arc::new(AtomicU64::new(super::util::now_ms())),
        }
    }

    /// When bytes last arrived, in `util::now_ms` milliseconds.
    pub(crate) fn heard(&self) -> Arc<AtomicU64> {
        self.heard.clone()
    }

    /// Bytes arrived now.
    fn hear(&self) {
        self.heard.store(super::util::now_ms(), Ordering::Relaxed);
    }

    /// Waits for the copy into device memory that is still running, if one
    /// is: a frame that is not `Data` (a `Finish`, an `Abort`) is handled
    /// only after every byte before it has landed, or failed to.
    pub(crate) async fn settle(&mut self) -> Result<(), ConnError> {
        let Some(landing) = self.landing.take() else {
            return Ok(());
        };
        let (buf, r) = landing.wait().await;
        self.free.extend(buf);
        r
    }

    /// From now on the stream is the secure channel's; bytes already read
    /// past the handshake are its first ciphertext.
    pub(crate) fn secure(&mut self, mut opener: Opener) {
        opener.received(&self.buf[self.start..self.end]);
        self.start = 0;
        self.end = 0;
        self.sec = Some(Box::new(opener));
    }

    /// The size of the read buffer (for tests).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.buf.len()
    }

    async fn fill(&mut self, need: usize) -> Result<(), ConnError> {
        debug_assert!(need <= MAX_FRAME);
        while self.end - self.start < need {
            if self.buf.len() - self.start < need {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end == self.buf.len() {
                // Full of bytes received, and the frame needs more: grow
                // with what arrived (at most doubling).
                let len = (self.buf.len() * 2).clamp(INITIAL, MAX_FRAME);
                self.buf.resize(len, 0);
            }
            let limit = if self.bulk {
                (self.start + need + BULK_READ_AHEAD).min(self.buf.len())
            } else {
                self.buf.len()
            };
            let n = match &mut self.sec {
                None => self.rd.read(&mut self.buf[self.end..limit]).await?,
                Some(sec) => {
                    let p = sec.next(&mut self.rd, limit - self.end).await?;
                    self.buf[self.end..self.end + p.len()].copy_from_slice(p);
                    p.len()
                }
            };
            if n == 0 {
                return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            self.hear();
            self.end += n;
            if self.end == self.buf.len() && self.buf.len() < DEFAULT && !self.first {
                // A read filled the buffer: more is probably waiting.
                let len = (self.buf.len() * 2).min(DEFAULT);
                self.buf.resize(len, 0);
            }
        }
        Ok(())
    }

    /// Gives back what a large frame made the buffer grow beyond its
    /// default size, once the bytes buffered fit.
    fn shrink(&mut self) {
        if self.buf.len() > DEFAULT && self.end - self.start <= DEFAULT {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            self.buf.truncate(DEFAULT);
            self.buf.shrink_to_fit();
        }
    }

    /// The next frame, of any type (the first frame of a connection: a
    /// `Hello`).
    pub(crate) async fn next(&mut self) -> Result<Message, ConnError> {
        self.next_expecting(Expect::ANY).await
    }

    /// The next frame, which must be of a type that `expect` accepts (the
    /// first frame of a connection: a `Hello`, whatever `expect` says). A
    /// frame of another type is refused from its header, before its body
    /// is read: `ConnError::Unexpected`; for an `Open`, with its request
    /// number (so that the refusal can name it), of which only those first
    /// 8 bytes of its body are read.
    pub(crate) async fn next_expecting(&mut self, expect: Expect) -> Result<Message, ConnError> {
        self.shrink();
        self.fill(wire::HEADER_LEN).await?;
        let h: [u8; wire::HEADER_LEN] = self.buf[self.start..self.start + wire::HEADER_LEN]
            .try_into()
            .expect("length checked");
        let header = wire::decode_header(&h)?;
        let expect = if self.first { Expect::HELLO } else { expect };
        if expect.check(&header).is_err() {
            let ty = header.frame_type();
            let mut req = None;
            if ty == wire::FrameType::Open && header.body_len >= 8 {
                self.fill(wire::HEADER_LEN + 8).await?;
                let at = self.start + wire::HEADER_LEN;
                req = header.req(&self.buf[at..at + 8]);
            }
            return Err(ConnError::Unexpected(ty, req));
        }
        if self.first && header.body_len > wire::MAX_HELLO_BODY {
            return Err(ConnError::Channel(format!(
                "a first frame of {} bytes, larger than any hello",
                header.body_len
            )));
        }
        let total = wire::HEADER_LEN + header.body_len as usize;
        self.fill(total).await?;
        let msg = wire::decode_body(
            header,
            &self.buf[self.start + wire::HEADER_LEN..self.start + total],
        )?;
        self.start += total;
        self.first = false;
        Ok(msg)
    }

    /// Moves `len` payload bytes into `dst` (segment, offset) of a region
    /// and on into the segments that follow, or discards them when there is
    /// no destination or the region closes. A failed copy into device
    /// memory ends the request through `fail` (the rest is discarded), or
    /// the connection without one.
    pub(crate) async fn payload(
        &mut self,
        len: u32,
        dst: Option<(&Arc<Region>, u32, u64)>,
        fail: Option<OnFail>,
    ) -> Result<(), ConnError> {
        self.bulk = len >= BULK_PAYLOAD;
        let owner = dst.map(|d| d.0);
        let mut dst = dst.map(|(r, seg, off)| (&**r, seg as usize, off));
        let mut left = len as usize;
        let buffered = left.min(self.end - self.start);
        // Device memory in plaintext takes the bytes already buffered into
        // its first host buffer (below), rather than landing them now, in
        // the way of the landing still in flight.
        let staged = self.sec.is_none() && dst.is_some_and(|d| !d.0.is_host());
        let mut carry = if staged { buffered } else { 0 };
        if buffered > 0 && !staged {
            if let Some((region, seg, off)) = dst {
                let src = &self.buf[self.start..self.start + buffered];
                dst = land(region, seg, off, src, fail.as_ref())?;
            }
            self.start += buffered;
            left -= buffered;
        }
        if let Some(sec) = &mut self.sec {
            return secure_payload(sec, &mut self.rd, left, dst, fail.as_ref(), &self.heard).await;
        }
        while left > 0 {
            if left < len as usize {
                // Payload bytes arrived since the last turn.
                self.hear();
            }
            match (dst, owner) {
                (Some((region, seg, off)), Some(owner)) if !region.is_host() => {
                    // Device memory: read into a host buffer while the one
                    // before lands, then lands from it in turn.
                    let n = left.min(STAGE);
                    let mut buf = host_buf(region, self.free.pop(), STAGE);
                    // What was buffered (less than `STAGE`: all of it
                    // goes into the first buffer).
                    let c = carry.min(n);
                    buf[..c].copy_from_slice(&self.buf[self.start..self.start + c]);
                    self.start += c;
                    carry -= c;
                    let read = self.rd.read_exact(&mut buf[c..n]).await;
                    let settled = self.settle().await;
                    if let Err(e) = read {
                        return Err(e.into());
                    }
                    settled?;
                    left -= n;
                    if !region.is_open() {
                        self.free.push(buf);
                        dst = None;
                        continue;
                    }
                    self.landing = Some(Landing::start(owner, (seg, off), buf, n, fail.clone()));
                    let (seg, off) = region.advance(seg, off, n);
                    dst = Some((region, seg, off));
                }
                (Some((region, seg, off)), _) => {
                    self.rd.readable().await?;
                    let rd = &self.rd;
                    // Straight from the socket into as many blocks as one
                    // system call takes.
                    match region.write_span(seg, off, left, |d| rd.try_read_vectored(d)) {
                        Ok(Ok(0)) => {
                            return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into()))
                        }
                        Ok(Ok(n)) => {
                            left -= n;
                            let (seg, off) = region.advance(seg, off, n);
                            dst = Some((region, seg, off));
                        }
                        Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Ok(Err(e)) => return Err(e.into()),
                        Err(Denied::Closed) => dst = None,
                        Err(Denied::OutOfBounds) => return Err(outside()),
                        Err(Denied::NotHostMemory) => return Err(not_host()),
                    }
                }
                (None, _) if carry > 0 => {
                    // Buffered bytes of a closed device region: dropped.
                    let c = carry.min(left);
                    self.start += c;
                    carry -= c;
                    left -= c;
                }
                (None, _) => {
                    // The buffer is empty here: everything buffered was consumed above.
                    let n = left.min(self.buf.len());
                    self.rd.read_exact(&mut self.buf[..n]).await?;
                    self.start = 0;
                    self.end = 0;
                    left -= n;
                }
            }
        }
        Ok(())
    }
}

/// [`FrameReader::payload`] through the secure channel: each message is
/// authenticated before its bytes are copied into the region.
async fn secure_payload(
    sec: &mut Opener,
    rd: &mut OwnedReadHalf,
    mut left: usize,
    mut dst: Dst<'_>,
    fail: Option<&OnFail>,
    heard: &AtomicU64,
) -> Result<(), ConnError> {
    while left > 0 {
        let p = sec.next(rd, left).await?;
        heard.store(super::util::now_ms(), Ordering::Relaxed);
        if let Some((region, seg, off)) = dst {
            dst = land(region, seg, off, p, fail)?;
        }
        left -= p.len();
    }
    Ok(())
}

/// Writes a connection's frames. Whoever holds it (under the connection's
/// write lock) must leave it [`flushed`](Self::flushed), or hand it to a
/// task that finishes the write (`write_all` of the rest of the frame).
pub(crate) struct ConnWriter {
    w: OwnedWriteHalf,
    sec: Option<Box<SecureOut>>,
}

/// The secure channel's side of a writer.
struct SecureOut {
    sealer: Sealer,
    /// Ciphertext of frames already taken, not yet on the socket:
    /// `out[start..end]`.
    out: Vec<u8>,
    start: usize,
    end: usize,
}

impl SecureOut {
    fn seal(&mut self, plain: &[u8]) -> io::Result<()> {
        self.sealer.seal(plain, &mut self.out, &mut self.end)
    }

    async fn flush(&mut self, w: &mut OwnedWriteHalf) -> io::Result<()> {
        while self.start < self.end {
            let n = w.write(&self.out[self.start..self.end]).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.start += n;
        }
        self.start = 0;
        self.end = 0;
        Ok(())
    }

    /// Takes all of `frame` if at least one byte of its ciphertext enters
    /// the socket now, else nothing (`WouldBlock`; the ciphertext made for
    /// the attempt is discarded unseen, and its nonces with it).
    fn try_take(&mut self, w: &OwnedWriteHalf, frame: &[u8]) -> io::Result<usize> {
        // What earlier frames left waiting goes first.
        while self.start < self.end {
            match w.try_write(&self.out[self.start..self.end]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.start += n,
                Err(e) => return Err(e),
            }
        }
        self.start = 0;
        self.end = 0;
        let nonce = self.sealer.nonce();
        self.seal(frame)?;
        match w.try_write(&self.out[..self.end]) {
            Ok(n) if n > 0 => {
                self.start = n;
                if n == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(frame.len())
            }
            r => {
                self.end = 0;
                self.sealer.forget_since(nonce);
                r
            }
        }
    }
}

impl ConnWriter {
    pub(crate) fn new(w: OwnedWriteHalf) -> Self {
        ConnWriter { w, sec: None }
    }

    /// From now on the stream is the secure channel's.
    pub(crate) fn secure(&mut self, sealer: Sealer) {
        self.sec = Some(Box::new(SecureOut {
            sealer,
            out: Vec::new(),
            start: 0,
            end: 0,
        }));
    }

    /// No byte of a frame already taken is waiting to be written.
    pub(crate) fn flushed(&self) -> bool {
        self.sec.as_ref().map_or(true, |s| s.start == s.end)
    }

    pub(crate) async fn writable(&self) -> io::Result<()> {
        self.w.writable().await
    }

    /// Writes what is waiting, then all of `frame`.
    pub(crate) async fn write_all(&mut self, frame: &[u8]) -> io::Result<()> {
        let Some(s) = &mut self.sec else {
            return self.w.write_all(frame).await;
        };
        s.flush(&mut self.w).await?;
        for piece in frame.chunks(BATCH) {
            s.seal(piece)?;
            s.flush(&mut self.w).await?;
        }
        Ok(())
    }

    /// Writes what the socket takes now, without waiting: `Ok(n)`, `n`
    /// bytes of `frame` taken (the caller writes the rest with
    /// [`write_all`](Self::write_all), which also writes whatever is left
    /// waiting: check [`flushed`](Self::flushed)), or `WouldBlock` with
    /// nothing taken. Through the secure channel a frame is taken whole or
    /// not at all.
    pub(crate) fn try_write(&mut self, frame: &[u8]) -> io::Result<usize> {
        match &mut self.sec {
            None => self.w.try_write(frame),
            Some(s) => s.try_take(&self.w, frame),
        }
    }

    pub(crate) async fn shutdown(&mut self) -> io::Result<()> {
        self.w.shutdown().await
    }

    /// Sends the `Data` frame `header`, its `len` payload bytes taken from
    /// the region from `offset` of segment `desc` on, running into the
    /// segments that follow. If the region closes meanwhile, the rest of
    /// the payload is zeros (the frame must be completed) and `Ok(false)` is
    /// returned; if it was closed before, nothing is sent. Host memory
    /// only: device memory is copied off the device first
    /// (`Conn::stream_device`).
    pub(crate) async fn send_data(
        &mut self,
        header: &[u8],
        region: &Region,
        desc: u32,
        offset: u64,
        len: u32,
    ) -> io::Result<bool> {
        if !region.is_host() {
            return Err(io::Error::other(
                "device memory reached the host memory's send path",
            ));
        }
        if let Some(s) = &mut self.sec {
            return send_data_sealed(s, &mut self.w, header, region, desc, offset, len).await;
        }
        let w = &mut self.w;
        let len = len as usize;
        let (mut hdr_sent, mut sent) = (0usize, 0usize);
        let (mut seg, mut off) = (desc as usize, offset);
        let mut open = true;
        while hdr_sent < header.len() || sent < len {
            if open {
                w.writable().await?;
                let ww = &*w;
                // Header and payload in one system call, the payload straight
                // from the source memory, as many blocks as the call takes.
                let r = region.read_span(seg, off, len - sent, |s| {
                    if hdr_sent < header.len() {
                        let mut v = Vec::with_capacity(s.len() + 1);
                        v.push(IoSlice::new(&header[hdr_sent..]));
                        v.extend_from_slice(s);
                        ww.try_write_vectored(&v)
                    } else {
                        ww.try_write_vectored(s)
                    }
                });
                match r {
                    Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(Ok(n)) => {
                        let h = n.min(header.len() - hdr_sent);
                        hdr_sent += h;
                        sent += n - h;
                        (seg, off) = region.advance(seg, off, n - h);
                    }
                    Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Ok(Err(e)) => return Err(e),
                    // Closed before the frame started: send nothing of it.
                    Err(_) if hdr_sent == 0 => return Ok(false),
                    Err(_) => open = false,
                }
            } else {
                // Closed mid-frame: complete it with zeros.
                w.write_all(&header[hdr_sent..]).await?;
                hdr_sent = header.len();
                let n = (len - sent).min(ZEROS.len());
                w.write_all(&ZEROS[..n]).await?;
                sent += n;
            }
        }
        Ok(open)
    }
}

/// [`ConnWriter::send_data`] through the secure channel: the payload is
/// encrypted from the source memory, [`BATCH`] bytes per hold of the
/// region's lock, and written outside it.
async fn send_data_sealed(
    s: &mut SecureOut,
    w: &mut OwnedWriteHalf,
    header: &[u8],
    region: &Region,
    desc: u32,
    offset: u64,
    len: u32,
) -> io::Result<bool> {
    s.flush(w).await?;
    let len = len as usize;
    let (mut started, mut sent, mut open) = (false, 0usize, true);
    let (mut seg, mut off) = (desc as usize, offset);
    while !started || sent < len {
        let n = (len - sent).min(BATCH);
        if open {
            let seal = |src: &[IoSlice<'_>], s: &mut SecureOut| {
                if !started {
                    s.seal(header)?;
                }
                let mut took = 0;
                for piece in src {
                    s.seal(piece)?;
                    took += piece.len();
                }
                io::Result::Ok(took)
            };
            match region.read_span(seg, off, n, |src| seal(src, s)) {
                Ok(r) => {
                    let took = r?;
                    started = true;
                    sent += took;
                    (seg, off) = region.advance(seg, off, took);
                }
                // Closed before the frame started: send nothing of it.
                Err(_) if !started => return Ok(false),
                Err(_) => open = false,
            }
        } else {
            // Closed mid-frame: complete it with zeros.
            let n = n.min(ZEROS.len());
            s.seal(&ZEROS[..n])?;
            sent += n;
        }
        s.flush(w).await?;
    }
    Ok(open)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::wire::{Hello, Open, PROTOCOL_VERSION};
    use ferry_proto::{OperationKind, Token};
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (FrameReader, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (FrameReader::new(s.into_split().0), c)
    }

    fn hello() -> Vec<u8> {
        Message::Hello(Hello {
            version: PROTOCOL_VERSION,
            worker_id: "w".into(),
        })
        .to_vec()
    }

    #[tokio::test]
    async fn a_first_frame_larger_than_any_hello_is_refused_before_the_buffer_grows() {
        let (mut rd, mut c) = pair().await;
        let mut h = vec![1u8, 0, 0, 0];
        h.extend_from_slice(&(wire::MAX_HELLO_BODY + 1).to_le_bytes());
        c.write_all(&h).await.unwrap();
        assert!(matches!(
            rd.next().await,
            Err(ConnError::Wire(wire::WireError::BodyTooLarge(_)))
        ));
        assert_eq!(rd.capacity(), INITIAL);
    }

    #[tokio::test]
    async fn a_frame_not_valid_here_is_refused_from_its_header() {
        // A first frame that is not a hello: refused without its body.
        let (mut rd, mut c) = pair().await;
        let mut open = header_only(2, 62);
        open.extend_from_slice(&9u64.to_le_bytes());
        c.write_all(&open).await.unwrap();
        assert!(matches!(
            rd.next().await,
            Err(ConnError::Unexpected(wire::FrameType::Open, Some(9)))
        ));
        // After a hello, where only an `Auth` may come: a `Lease` is
        // refused from its header (the 45 bytes of its body never sent).
        let (mut rd, mut c) = pair().await;
        c.write_all(&hello()).await.unwrap();
        assert!(matches!(rd.next().await, Ok(Message::Hello(_))));
        c.write_all(&header_only(7, 45)).await.unwrap();
        let refused = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            rd.next_expecting(Expect::AUTH),
        )
        .await
        .expect("refused at once, not waiting for the body");
        assert!(matches!(
            refused,
            Err(ConnError::Unexpected(wire::FrameType::Lease, None))
        ));
        assert_eq!(rd.capacity(), INITIAL);
    }

    fn header_only(ty: u8, body_len: u32) -> Vec<u8> {
        let mut h = vec![ty, 0, 0, 0];
        h.extend_from_slice(&body_len.to_le_bytes());
        h
    }

    #[tokio::test]
    async fn the_buffer_grows_with_bytes_received_and_shrinks_after_a_large_frame() {
        let (mut rd, mut c) = pair().await;
        c.write_all(&hello()).await.unwrap();
        assert!(matches!(rd.next().await, Ok(Message::Hello(_))));
        // Announced, not sent: nothing grows.
        let open = Message::Open(Open {
            req: 1,
            op_id: 1,
            token: Token::from_bytes([0; 16]),
            kind: OperationKind::Read,
            // As many runs as an Open may carry: the largest Open.
            sizes: (0..16_384)
                .map(|i| 1 + (i & 1))
                .collect::<Vec<u64>>()
                .into(),
            pull: false,
            part: 0,
            parts: 1,
        })
        .to_vec();
        assert!(open.len() > 2 * DEFAULT && open.len() <= MAX_FRAME);
        c.write_all(&open[..wire::HEADER_LEN]).await.unwrap();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(200), rd.next()).await;
        assert!(waiting.is_err(), "the body has not arrived");
        assert_eq!(rd.capacity(), INITIAL);
        // The body arrives: the buffer grows to hold it...
        c.write_all(&open[wire::HEADER_LEN..]).await.unwrap();
        c.write_all(&hello()).await.unwrap();
        let msg = rd.next().await;
        assert!(matches!(msg, Ok(Message::Open(o)) if o.sizes.len() == 16_384));
        assert!(rd.capacity() >= open.len() && rd.capacity() <= MAX_FRAME);
        // ...and shrinks back after it.
        assert!(matches!(rd.next().await, Ok(Message::Hello(_))));
        assert_eq!(rd.capacity(), DEFAULT);
    }
}
