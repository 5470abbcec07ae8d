//! Pipelined staging of device memory through pinned host buffers: how GPU
//! memory will travel over the host transports (TCP, cross-memory attach)
//! where no direct path (CUDA IPC, RDMA) reaches it.
//!
//! Both directions overlap the copy between device and host with the
//! transport: the source ([`Outbound`]) copies chunk `k + 1` (up to `depth`
//! chunks ahead) out of the device while chunk `k` is being written to the
//! socket; the destination ([`Inbound`]) copies chunk `k` into the device
//! while chunk `k + 1` is read from the socket.
//!
//! The copies go through a [`CopyEngine`], so that the pipelines are tested
//! without a GPU: `engine::HostEngine` stands in for the device with host
//! memory and a worker thread, `engine::CudaEngine` is the real one
//! (pinned staging buffers, one stream, asynchronous copies and events).
//!
//! The fence: neither pipeline returns (nor is dropped) while a copy it
//! started may still run, so a staging buffer is never freed, and device
//! memory never written, behind the caller's back. After
//! [`Inbound::abort`] returns, nothing more lands in device memory.

// Nothing outside the tests uses these until staging is wired into the
// transports (`docs/gpu.md`).
#![cfg_attr(not(test), allow(dead_code))]

use std::collections::VecDeque;
use std::io;

use super::CudaError;

/// The default size of one staging buffer (and of one chunk).
pub(crate) const DEFAULT_CHUNK: usize = 2 << 20;
/// The default number of staging buffers (chunks in flight) per pipeline.
pub(crate) const DEFAULT_DEPTH: usize = 2;

/// Something that copies between device memory and host staging buffers
/// asynchronously: the driver, or a stand-in for tests.
///
/// A staging buffer moves into the copy that uses it and comes back from
/// [`wait`](Self::wait): nothing else can touch it while the copy runs.
pub(crate) trait CopyEngine {
    /// Device memory as this engine names it.
    type Mem: ?Sized;
    /// A host staging buffer (pinned memory, for the driver).
    type Staging: AsRef<[u8]> + AsMut<[u8]>;
    /// A copy started and not yet waited for. Dropping one waits for its
    /// copy to end (or otherwise keeps the memory it uses alive until it
    /// does).
    type Pending;

    /// The size of `mem` in bytes.
    fn mem_len(mem: &Self::Mem) -> usize;

    /// A staging buffer of `len` bytes.
    fn alloc_staging(&self, len: usize) -> Result<Self::Staging, CudaError>;

    /// Starts copying `len` bytes of `mem` at `offset` into the start of
    /// `staging`. On error no copy was started and `staging` comes back.
    ///
    /// # Safety
    ///
    /// `mem` must stay allocated until the returned copy has been waited
    /// for or dropped, and the returned value must not be leaked (with
    /// `mem::forget` or a reference cycle): its drop is what waits.
    unsafe fn start_d2h(
        &self,
        mem: &Self::Mem,
        offset: usize,
        staging: Self::Staging,
        len: usize,
    ) -> Result<Self::Pending, (Self::Staging, CudaError)>;

    /// Starts copying the first `len` bytes of `staging` into `mem` at
    /// `offset`. On error no copy was started and `staging` comes back.
    ///
    /// # Safety
    ///
    /// As [`start_d2h`](Self::start_d2h); in addition nothing else may
    /// read or write that range of `mem` until the copy has ended.
    unsafe fn start_h2d(
        &self,
        staging: Self::Staging,
        len: usize,
        mem: &Self::Mem,
        offset: usize,
    ) -> Result<Self::Pending, (Self::Staging, CudaError)>;

    /// Whether the copy has ended (successfully or not); `Err` if the
    /// engine cannot tell.
    fn poll(&self, pending: &mut Self::Pending) -> Result<bool, CudaError>;

    /// Waits for the copy to end: its staging buffer back, and how it went.
    fn wait(&self, pending: Self::Pending) -> (Self::Staging, Result<(), CudaError>);
}

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StagingError {
    /// The engine failed to start or finish a copy.
    #[error(transparent)]
    Engine(#[from] CudaError),
    /// The consumer of outbound chunks failed (the socket, typically).
    #[error("consumer failed: {0}")]
    Consumer(io::Error),
    /// More bytes were pushed than the device range holds.
    #[error("{got} bytes pushed into a device range of {want}")]
    TooLong {
        /// Bytes pushed, the refused push included.
        got: usize,
        /// The size of the range.
        want: usize,
    },
    /// Finished before the device range was filled.
    #[error("finished after {got} bytes of {want}")]
    Incomplete {
        /// Bytes pushed.
        got: usize,
        /// The size of the range.
        want: usize,
    },
    /// The pipeline was aborted, finished or failed before this call.
    #[error("the staging pipeline is closed")]
    Closed,
}

fn check_range(offset: usize, len: usize, size: usize) -> Result<(), CudaError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(CudaError::OutOfRange { offset, len, size }),
    }
}

/// Allocates `depth` staging buffers of `chunk` bytes.
fn alloc_all<E: CopyEngine>(
    engine: &E,
    chunk: usize,
    depth: usize,
) -> Result<Vec<E::Staging>, CudaError> {
    (0..depth).map(|_| engine.alloc_staging(chunk)).collect()
}

/// The source side: device memory out to the host in chunks, in order,
/// through `depth` staging buffers, handed to a consumer (the socket).
/// The staging buffers are kept for the next [`send`](Self::send).
pub(crate) struct Outbound<'e, E: CopyEngine> {
    engine: &'e E,
    chunk: usize,
    free: Vec<E::Staging>,
}

impl<'e, E: CopyEngine> Outbound<'e, E> {
    /// A pipeline of `depth` staging buffers of `chunk` bytes (each at
    /// least 1).
    pub(crate) fn new(engine: &'e E, chunk: usize, depth: usize) -> Result<Self, CudaError> {
        let chunk = chunk.max(1);
        Ok(Outbound {
            engine,
            chunk,
            free: alloc_all(engine, chunk, depth.max(1))?,
        })
    }

    /// With [`DEFAULT_CHUNK`] and [`DEFAULT_DEPTH`].
    pub(crate) fn with_defaults(engine: &'e E) -> Result<Self, CudaError> {
        Self::new(engine, DEFAULT_CHUNK, DEFAULT_DEPTH)
    }

    /// Hands `len` bytes of `mem` at `offset` to `consume`, chunk by chunk
    /// in order. The copy of chunk `k + 1` (up to `depth - 1` chunks ahead)
    /// is started before chunk `k` is handed over. The first error (the
    /// engine's or the consumer's) stops it at once: no further copy is
    /// started, and no later chunk reaches the consumer. Every copy it
    /// started has ended when it returns, whichever way.
    pub(crate) fn send(
        &mut self,
        mem: &E::Mem,
        offset: usize,
        len: usize,
        mut consume: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<(), StagingError> {
        check_range(offset, len, E::mem_len(mem))?;
        let mut inflight: VecDeque<(usize, E::Pending)> = VecDeque::new();
        let mut started = 0;
        let mut failed: Option<StagingError> = None;
        'run: loop {
            // Keep every free staging buffer busy with the next chunks.
            while started < len {
                let Some(buf) = self.free.pop() else { break };
                let n = self.chunk.min(len - started);
                // SAFETY: `mem` is borrowed for the whole call, and every
                // pending copy is waited for (or dropped, which waits)
                // before it returns or unwinds; none is leaked.
                match unsafe { self.engine.start_d2h(mem, offset + started, buf, n) } {
                    Ok(p) => {
                        inflight.push_back((n, p));
                        started += n;
                    }
                    Err((buf, e)) => {
                        self.free.push(buf);
                        failed = Some(e.into());
                        break 'run;
                    }
                }
            }
            let Some((n, p)) = inflight.pop_front() else {
                break;
            };
            let (buf, r) = self.engine.wait(p);
            let r = match r {
                Ok(()) => consume(&buf.as_ref()[..n]).map_err(StagingError::Consumer),
                Err(e) => Err(e.into()),
            };
            self.free.push(buf);
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        // Stopped early: let the copies already started end before their
        // buffers are reused or freed. Their own errors add nothing.
        for (_, p) in inflight {
            let (buf, _) = self.engine.wait(p);
            self.free.push(buf);
        }
        failed.map_or(Ok(()), Err)
    }
}

/// Where an [`Inbound`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// Finished, aborted or failed: refuses every push.
    Closed,
}

/// The destination side: chunks from the host (the socket) into device
/// memory, in order, through `depth` staging buffers: each push is copied
/// into a free staging buffer, whose copy to the device starts as soon as
/// it is full, with at most `depth` copies in flight.
pub(crate) struct Inbound<'a, E: CopyEngine> {
    engine: &'a E,
    mem: &'a E::Mem,
    offset: usize,
    len: usize,
    chunk: usize,
    free: Vec<E::Staging>,
    /// The staging buffer being filled, and how far.
    filling: Option<(E::Staging, usize)>,
    inflight: VecDeque<E::Pending>,
    /// Bytes pushed.
    accepted: usize,
    /// Bytes whose copy to the device has started.
    started: usize,
    state: State,
}

impl<'a, E: CopyEngine> Inbound<'a, E> {
    /// A pipeline that fills `len` bytes of `mem` at `offset`, through
    /// `depth` staging buffers of `chunk` bytes (each at least 1).
    pub(crate) fn new(
        engine: &'a E,
        mem: &'a E::Mem,
        offset: usize,
        len: usize,
        chunk: usize,
        depth: usize,
    ) -> Result<Self, CudaError> {
        check_range(offset, len, E::mem_len(mem))?;
        let chunk = chunk.max(1);
        Ok(Inbound {
            engine,
            mem,
            offset,
            len,
            chunk,
            free: alloc_all(engine, chunk, depth.max(1))?,
            filling: None,
            inflight: VecDeque::new(),
            accepted: 0,
            started: 0,
            state: State::Open,
        })
    }

    /// Bytes pushed so far.
    pub(crate) fn accepted(&self) -> usize {
        self.accepted
    }

    /// Takes the next bytes of the range, of any length. Blocks while every
    /// staging buffer is in flight. An error (the engine's, or more bytes
    /// than the range holds) closes the pipeline as [`abort`](Self::abort)
    /// does, and is returned once; later calls get
    /// [`StagingError::Closed`].
    pub(crate) fn push(&mut self, mut data: &[u8]) -> Result<(), StagingError> {
        if self.state != State::Open {
            return Err(StagingError::Closed);
        }
        if data.len() > self.len - self.accepted {
            let got = self.accepted + data.len();
            return Err(self.fail(StagingError::TooLong {
                got,
                want: self.len,
            }));
        }
        while !data.is_empty() {
            let (mut buf, fill) = match self.filling.take() {
                Some(f) => f,
                None => (self.free_buffer()?, 0),
            };
            let n = (self.chunk - fill).min(data.len());
            buf.as_mut()[fill..fill + n].copy_from_slice(&data[..n]);
            data = &data[n..];
            self.accepted += n;
            let fill = fill + n;
            if fill == self.chunk || self.accepted == self.len {
                self.start(buf, fill)?;
            } else {
                self.filling = Some((buf, fill));
            }
        }
        Ok(())
    }

    /// Waits for every copy: `Ok` once all `len` bytes are in device
    /// memory. Closes the pipeline whichever way it ends.
    pub(crate) fn finish(&mut self) -> Result<(), StagingError> {
        if self.state != State::Open {
            return Err(StagingError::Closed);
        }
        if self.accepted < self.len {
            let got = self.accepted;
            return Err(self.fail(StagingError::Incomplete {
                got,
                want: self.len,
            }));
        }
        self.state = State::Closed;
        let mut first = Ok(());
        while let Some(p) = self.inflight.pop_front() {
            let (buf, r) = self.engine.wait(p);
            self.free.push(buf);
            if first.is_ok() {
                first = r.map_err(StagingError::from);
            }
        }
        first
    }

    /// Stops accepting and waits for the copies in flight (at most `depth`
    /// chunks, so the wait is bounded by those copies). After it returns
    /// nothing more lands in device memory; bytes pushed but not yet
    /// copied (a partly filled staging buffer) are dropped. Idempotent.
    pub(crate) fn abort(&mut self) {
        self.state = State::Closed;
        if let Some((buf, _)) = self.filling.take() {
            self.free.push(buf);
        }
        while let Some(p) = self.inflight.pop_front() {
            let (buf, _) = self.engine.wait(p);
            self.free.push(buf);
        }
    }

    /// Closes the pipeline as [`abort`](Self::abort) and gives `e` back.
    fn fail(&mut self, e: StagingError) -> StagingError {
        self.abort();
        e
    }

    /// A staging buffer to fill: a free one, else the oldest in flight once
    /// its copy has ended. Copies that ended are collected on the way, so
    /// that an engine error surfaces at the next push.
    fn free_buffer(&mut self) -> Result<E::Staging, StagingError> {
        loop {
            let done = match self.inflight.front_mut() {
                Some(p) => match self.engine.poll(p) {
                    Ok(done) => done,
                    Err(e) => return Err(self.fail(e.into())),
                },
                None => false,
            };
            if !done && !self.free.is_empty() {
                break;
            }
            let Some(p) = self.inflight.pop_front() else {
                break;
            };
            let (buf, r) = self.engine.wait(p);
            self.free.push(buf);
            if let Err(e) = r {
                return Err(self.fail(e.into()));
            }
        }
        match self.free.pop() {
            Some(buf) => Ok(buf),
            // Unreachable: `depth >= 1` buffers, each free, filling or in
            // flight; reported rather than trusted.
            None => Err(self.fail(StagingError::Closed)),
        }
    }

    /// Starts the copy of the first `n` bytes of `buf` to the device.
    fn start(&mut self, buf: E::Staging, n: usize) -> Result<(), StagingError> {
        // SAFETY: `self.mem` is borrowed for the pipeline's life, and every
        // pending copy is waited for before that ends (`finish`, `abort`,
        // or `Drop`, which aborts); no pending copy is leaked. Only this
        // pipeline writes its range while it lives.
        match unsafe {
            self.engine
                .start_h2d(buf, n, self.mem, self.offset + self.started)
        } {
            Ok(p) => {
                self.inflight.push_back(p);
                self.started += n;
                Ok(())
            }
            Err((buf, e)) => {
                self.free.push(buf);
                Err(self.fail(e.into()))
            }
        }
    }
}

impl<E: CopyEngine> Drop for Inbound<'_, E> {
    fn drop(&mut self) {
        self.abort();
    }
}

#[cfg(test)]
#[path = "staging_tests.rs"]
mod tests;
