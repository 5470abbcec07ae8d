//! Reading a TCP connection's frames: [`FrameReader`]. Payload bytes go
//! from the socket straight into the destination memory.
#![forbid(unsafe_code)]

use std::io;

use ferry_proto::wire::{self, Message};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

use super::tcp::ConnError;
use crate::region::{Denied, Region};

/// A new reader's buffer: room for the largest valid first frame (a
/// `Hello`) and some, so that nothing grows before a peer has said hello.
const INITIAL: usize = 2 * 1024;
/// What the buffer grows to as bytes stream in (a read that fills it), and
/// returns to after a larger frame.
const DEFAULT: usize = 64 * 1024;
/// A header and the largest body.
const MAX_FRAME: usize = wire::HEADER_LEN + wire::MAX_BODY as usize;
/// Payloads from this size on switch the reader to bulk mode.
const BULK_PAYLOAD: u32 = 32 * 1024;
/// How far a bulk-mode reader reads past the bytes it needs.
const BULK_READ_AHEAD: usize = 512;

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
    /// No frame has been read yet: the first must be a `Hello`, so it may
    /// not be larger than the largest one.
    first: bool,
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
        }
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
            let n = self.rd.read(&mut self.buf[self.end..limit]).await?;
            if n == 0 {
                return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
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

    pub(crate) async fn next(&mut self) -> Result<Message, ConnError> {
        self.shrink();
        self.fill(wire::HEADER_LEN).await?;
        let h: [u8; wire::HEADER_LEN] = self.buf[self.start..self.start + wire::HEADER_LEN]
            .try_into()
            .expect("length checked");
        let header = wire::decode_header(&h)?;
        if self.first && header.body_len > wire::MAX_HELLO_BODY {
            return Err(ConnError::Violation(format!(
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

    /// Moves `len` payload bytes into `dst` (segment, offset) of a region, or
    /// discards them when there is no destination or the region closes.
    pub(crate) async fn payload(
        &mut self,
        len: u32,
        mut dst: Option<(&Region, u32, u64)>,
    ) -> Result<(), ConnError> {
        self.bulk = len >= BULK_PAYLOAD;
        let mut left = len as usize;
        let buffered = left.min(self.end - self.start);
        if buffered > 0 {
            if let Some((region, seg, off)) = dst {
                let src = &self.buf[self.start..self.start + buffered];
                match region.write_at(seg as usize, off, buffered, |d| d.copy_from_slice(src)) {
                    Ok(()) => dst = Some((region, seg, off + buffered as u64)),
                    Err(Denied::Closed) => dst = None,
                    Err(Denied::OutOfBounds) => {
                        return Err(ConnError::Violation("data outside the descriptor".into()))
                    }
                }
            }
            self.start += buffered;
            left -= buffered;
        }
        while left > 0 {
            match dst {
                Some((region, seg, off)) => {
                    self.rd.readable().await?;
                    let rd = &self.rd;
                    match region.write_at(seg as usize, off, left, |d| rd.try_read(d)) {
                        Ok(Ok(0)) => {
                            return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into()))
                        }
                        Ok(Ok(n)) => {
                            left -= n;
                            dst = Some((region, seg, off + n as u64));
                        }
                        Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Ok(Err(e)) => return Err(e.into()),
                        Err(Denied::Closed) => dst = None,
                        Err(Denied::OutOfBounds) => {
                            return Err(ConnError::Violation("data outside the descriptor".into()))
                        }
                    }
                }
                None => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::wire::{Hello, Open, PROTOCOL_VERSION};
    use ferry_proto::{OperationKind, Token};
    use tokio::io::AsyncWriteExt;
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
        assert!(matches!(rd.next().await, Err(ConnError::Violation(_))));
        assert_eq!(rd.capacity(), INITIAL);
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
            sizes: vec![1; 16_384],
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
