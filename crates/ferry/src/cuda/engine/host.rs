//! [`HostEngine`]: a [`CopyEngine`] whose "device memory" is a host buffer,
//! for testing the staging pipelines without a GPU.
//!
//! Like a CUDA stream, one worker thread runs the copies in the order they
//! were started, and a failed copy poisons the engine (CUDA's errors on a
//! stream are sticky): every later copy fails without touching memory.
//! [`Faults`] injects a delay before each copy, a failure to start or to
//! complete copy `k`, or holds copy `k` until [`HostEngine::release`].
//! Counters say how many copies were started, ended and landed, so tests
//! assert ordering with counts rather than timing.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cuda::staging::CopyEngine;
use crate::cuda::CudaError;
use crate::sync::lock;

/// The stand-in for device memory: a shared host buffer.
#[derive(Clone)]
pub(crate) struct HostMem(Arc<Mutex<Vec<u8>>>);

impl HostMem {
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        HostMem(Arc::new(Mutex::new(bytes)))
    }

    /// A copy of its bytes now.
    pub(crate) fn snapshot(&self) -> Vec<u8> {
        lock(&self.0).clone()
    }
}

/// What to inject into a [`HostEngine`]'s copies (numbered from 0 in the
/// order they were started).
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults {
    /// Slept before each copy, on the worker.
    pub(crate) delay: Duration,
    /// This copy fails to start (`start_*` returns the error).
    pub(crate) fail_start: Option<usize>,
    /// This copy fails on the worker, writing nothing (and poisons the
    /// engine).
    pub(crate) fail_copy: Option<usize>,
    /// This copy waits on the worker until [`HostEngine::release`].
    pub(crate) hold: Option<usize>,
}

#[derive(Default)]
struct Counters {
    attempts: AtomicUsize,
    started: AtomicUsize,
    ended: AtomicUsize,
    landed: AtomicUsize,
    poisoned: AtomicBool,
}

/// A latch the held copy waits on.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = lock(&self.open);
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn open(&self) {
        *lock(&self.open) = true;
        self.cv.notify_all();
    }
}

/// A copy's staging buffer and how it went.
type Ended = (Vec<u8>, Result<(), CudaError>);

/// Where a copy's result lands for its waiter.
#[derive(Default)]
struct Slot {
    done: Mutex<Option<Ended>>,
    cv: Condvar,
}

enum Dir {
    ToStaging,
    ToMem,
}

struct Job {
    index: usize,
    dir: Dir,
    mem: HostMem,
    offset: usize,
    len: usize,
    staging: Vec<u8>,
    slot: Arc<Slot>,
}

/// A copy queued on a [`HostEngine`].
pub(crate) struct HostPending {
    slot: Arc<Slot>,
}

/// The host stand-in for the driver: see the module's documentation.
pub(crate) struct HostEngine {
    tx: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    gate: Arc<Gate>,
    faults: Faults,
}

impl HostEngine {
    pub(crate) fn new(faults: Faults) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let counters = Arc::new(Counters::default());
        let gate = Arc::new(Gate::default());
        let worker = {
            let (counters, gate, faults) = (counters.clone(), gate.clone(), faults.clone());
            std::thread::spawn(move || {
                for job in rx {
                    run(job, &counters, &gate, &faults);
                }
            })
        };
        HostEngine {
            tx: Some(tx),
            worker: Some(worker),
            counters,
            gate,
            faults,
        }
    }

    /// Copies started (queued), failed starts excluded.
    pub(crate) fn started(&self) -> usize {
        self.counters.started.load(Ordering::SeqCst)
    }

    /// Copies that ended, successfully or not.
    pub(crate) fn ended(&self) -> usize {
        self.counters.ended.load(Ordering::SeqCst)
    }

    /// Copies that ended successfully (wrote their bytes).
    pub(crate) fn landed(&self) -> usize {
        self.counters.landed.load(Ordering::SeqCst)
    }

    /// Lets the held copy ([`Faults::hold`]) run.
    pub(crate) fn release(&self) {
        self.gate.open();
    }

    fn start(
        &self,
        dir: Dir,
        mem: &HostMem,
        offset: usize,
        staging: Vec<u8>,
        len: usize,
    ) -> Result<HostPending, (Vec<u8>, CudaError)> {
        let size = lock(&mem.0).len();
        let fits = matches!(offset.checked_add(len), Some(end) if end <= size);
        if !fits || len > staging.len() {
            return Err((staging, CudaError::OutOfRange { offset, len, size }));
        }
        // Failed starts take a number too: `fail_start: Some(k)` names the
        // k-th attempt, and copies are numbered by attempt.
        let index = self.counters.attempts.fetch_add(1, Ordering::SeqCst);
        if self.faults.fail_start == Some(index) {
            return Err((
                staging,
                CudaError::Copy(format!("injected failure to start copy {index}")),
            ));
        }
        let slot = Arc::new(Slot::default());
        let job = Job {
            index,
            dir,
            mem: mem.clone(),
            offset,
            len,
            staging,
            slot: slot.clone(),
        };
        let Some(tx) = &self.tx else {
            return Err((job.staging, CudaError::Copy("engine stopped".into())));
        };
        self.counters.started.fetch_add(1, Ordering::SeqCst);
        if let Err(mpsc::SendError(job)) = tx.send(job) {
            self.counters.started.fetch_sub(1, Ordering::SeqCst);
            return Err((job.staging, CudaError::Copy("engine stopped".into())));
        }
        Ok(HostPending { slot })
    }
}

/// Runs one copy on the worker.
fn run(job: Job, counters: &Counters, gate: &Gate, faults: &Faults) {
    let Job {
        index,
        dir,
        mem,
        offset,
        len,
        mut staging,
        slot,
    } = job;
    if faults.hold == Some(index) {
        gate.wait();
    }
    if !faults.delay.is_zero() {
        std::thread::sleep(faults.delay);
    }
    let r = if counters.poisoned.load(Ordering::SeqCst) {
        Err(CudaError::Copy(format!(
            "copy {index} refused after an earlier failure"
        )))
    } else if faults.fail_copy == Some(index) {
        counters.poisoned.store(true, Ordering::SeqCst);
        Err(CudaError::Copy(format!("injected failure of copy {index}")))
    } else {
        let mut m = lock(&mem.0);
        match dir {
            Dir::ToStaging => staging[..len].copy_from_slice(&m[offset..offset + len]),
            Dir::ToMem => m[offset..offset + len].copy_from_slice(&staging[..len]),
        }
        counters.landed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    };
    counters.ended.fetch_add(1, Ordering::SeqCst);
    *lock(&slot.done) = Some((staging, r));
    slot.cv.notify_all();
}

impl Drop for HostEngine {
    fn drop(&mut self) {
        // A held copy would keep the worker from ever seeing the end.
        self.gate.open();
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl CopyEngine for HostEngine {
    type Mem = HostMem;
    type Staging = Vec<u8>;
    type Pending = HostPending;

    fn mem_len(mem: &HostMem) -> usize {
        lock(&mem.0).len()
    }

    fn alloc_staging(&self, len: usize) -> Result<Vec<u8>, CudaError> {
        Ok(vec![0; len])
    }

    unsafe fn start_d2h(
        &self,
        mem: &HostMem,
        offset: usize,
        staging: Vec<u8>,
        len: usize,
    ) -> Result<HostPending, (Vec<u8>, CudaError)> {
        self.start(Dir::ToStaging, mem, offset, staging, len)
    }

    unsafe fn start_h2d(
        &self,
        staging: Vec<u8>,
        len: usize,
        mem: &HostMem,
        offset: usize,
    ) -> Result<HostPending, (Vec<u8>, CudaError)> {
        self.start(Dir::ToMem, mem, offset, staging, len)
    }

    fn poll(&self, pending: &mut HostPending) -> Result<bool, CudaError> {
        Ok(lock(&pending.slot.done).is_some())
    }

    fn wait(&self, pending: HostPending) -> (Vec<u8>, Result<(), CudaError>) {
        let mut done = lock(&pending.slot.done);
        loop {
            if let Some(r) = done.take() {
                return r;
            }
            done = pending
                .slot
                .cv
                .wait(done)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}
